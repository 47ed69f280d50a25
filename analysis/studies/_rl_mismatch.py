"""The sampler-vs-trainer study: every RL framework's mismatch metrics per run, the per-token
``δ = trainer − rollout`` logprob, where it falls (position, the sampler's top-1/top-2 margin), and the
sequences with the largest K3 (the report's section draws them: :mod:`analysis.views.html.mismatch`).

Its input is the sampler-trainer pairs that ``bia experiment --trainer`` writes beside the runs
(``<folder>/trainer/<run>.jsonl``, prime-rl token exports), or any prime-rl export; a run directory
beside the pairs (``<folder>/<run>/``) gives the sampler's top-k candidates, hence the margin.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import polars as pl

from ..dumps import read_dump
from ..metrics import mismatch_summary, mismatch_table

TOP_SEQUENCES = 5  # per pairs file, in the largest-K3 table


def trainer_pairs(runs: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The trainer pairs written beside these runs (``RUN/../trainer/<RUN's name>.jsonl``), in the runs' order.

    Parameters
    ----------
    runs : iterable of str or path
        Run directories.

    Returns
    -------
    list of pathlib.Path
        Only the files that exist.

    Examples
    --------
    >>> [p.name for p in trainer_pairs(["data/experiment-cpu/default", "data/llamacpp-cpu/cache-prompt"])]
    ['default.jsonl']
    """
    found = [Path(run).parent / "trainer" / f"{Path(run).name}.jsonl" for run in runs]
    return [path for path in found if path.is_file()]


def _read(path: Path):
    """The pairs file's dump, read once per report (the section's tables and figures each need it)."""
    return _read_once(str(path), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _read_once(path: str, mtime_ns: int):
    return read_dump(path, backend="polars")


def _label(path: Path) -> str:
    """A pairs file by the run it scores: ``experiment-cpu/default`` for ``experiment-cpu/trainer/default.jsonl``; else
    by its folder and name (``vllm-hf-pair/pairs``).

    Examples
    --------
    >>> _label(Path("data/experiment-cpu/trainer/default.jsonl")), _label(Path("data/vllm-hf-pair/pairs.jsonl")), _label(Path("p.jsonl"))
    ('experiment-cpu/default', 'vllm-hf-pair/pairs', 'p')
    """
    if path.parent.name == "trainer":
        return f"{path.parent.parent.name}/{path.stem}"
    return f"{path.parent.name}/{path.stem}" if path.parent.name else path.stem


def mismatch_tokens(pairs: Sequence[str | os.PathLike[str]]) -> pl.DataFrame:
    """Every scored token of the pairs files, with its ``delta`` (trainer − rollout logprob) and the sampler's margin.

    Parameters
    ----------
    pairs : sequence of paths
        prime-rl token exports carrying both logprobs (as ``bia experiment --trainer`` writes them).

    Returns
    -------
    pl.DataFrame
        ``run``, ``request`` (the sample id), ``prompt_id``, ``c``, ``position``, ``rollout_logprob``,
        ``trainer_logprob``, ``delta``, and ``margin``: the sampler's top-1 minus top-2 logprob at that step,
        from the run directory beside the pairs (null without one).

    Examples
    --------
    >>> tokens = mismatch_tokens(["data/experiment-cpu/trainer/fixed-tiles.jsonl"])
    >>> tokens.height, tokens["delta"].abs().max(), tokens["margin"].null_count()
    (3968, 0.0, 0)
    """
    frames = []
    for path in map(Path, pairs):
        dump = _read(path)
        key = ["source", "record", "position"]
        trainer = dump.candidates.filter(pl.col("list_kind") == "trainer_recompute").select(
            *key, trainer_logprob="cand_logprob"
        )
        requests = dump.requests.select(
            "source",
            "record",
            request="sample_key",
            prompt_id=pl.col("extra").str.json_path_match("$.prompt_id"),
            c=pl.coalesce(
                pl.col("extra").str.json_path_match("$.c"), pl.col("extra").str.json_path_match("$.band_c")
            ).cast(pl.Int64, strict=False),  # legacy key of pairs written before run_version 2
        )
        tokens = (
            dump.tokens.filter(pl.col("segment") == "completion")
            .select(*key, rollout_logprob="logprob")
            .join(trainer, on=key, how="left")
            .join(requests, on=["source", "record"], how="left")
        )
        frames.append(
            tokens.with_columns(run=pl.lit(_label(path))).join(_margins(path), on=["request", "position"], how="left")
        )
    schema = {
        "run": pl.String,
        "request": pl.String,
        "prompt_id": pl.String,
        "c": pl.Int64,
        "position": pl.Int64,
        "rollout_logprob": pl.Float64,
        "trainer_logprob": pl.Float64,
        "margin": pl.Float64,
    }
    out = pl.concat([f.select(list(schema)).cast(schema) for f in frames]) if frames else pl.DataFrame(schema=schema)
    return out.with_columns(delta=pl.col("trainer_logprob") - pl.col("rollout_logprob")).select(
        *list(schema)[:-1], "delta", "margin"
    )


def _margins(pairs: Path) -> pl.DataFrame:
    """Per request id and position, the sampler's top-1 minus top-2 logprob, from the run beside the pairs (empty without one)."""
    manifest = pairs.parent.parent / pairs.stem / "manifest.json"
    return _margins_once(str(manifest.parent), manifest.stat().st_mtime_ns if manifest.is_file() else None)


@functools.lru_cache(maxsize=16)
def _margins_once(folder: str, mtime_ns: int | None) -> pl.DataFrame:
    from ..run import read_run

    empty = pl.DataFrame(
        schema={"request": pl.String, "position": pl.Int64, "margin": pl.Float64, "run_logprob": pl.Float64}
    )
    if mtime_ns is None:
        return empty
    run = read_run(folder)
    key = ["source", "record", "position"]
    top = (
        run.candidates.filter((pl.col("list_kind") == "top_logprobs") & (pl.col("segment") == "completion"))
        .group_by(key)
        .agg(margin=pl.col("cand_logprob").top_k(2).first() - pl.col("cand_logprob").top_k(2).last())
    )
    own = run.tokens.filter(pl.col("segment") == "completion").select(*key, run_logprob="logprob")
    return (
        own.join(top, on=key, how="left")
        .join(run.requests.select("source", "record", request="request_id"), on=["source", "record"])
        .select(empty.columns)
    )


def stale_pairs(pairs: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Why a pairs file is not of the run beside it (the run decoded again since, or another run's pairs): one sentence per
    such file, naming its first token whose sampler logprob the run does not hold; empty when every file matches.

    Parameters
    ----------
    pairs : sequence of str or path
        Sampler-trainer pairs files, each beside its run (``RUN/../trainer/RUN.jsonl``).

    Returns
    -------
    list of str

    Examples
    --------
    >>> stale_pairs(["data/experiment-cpu/trainer/default.jsonl"])
    []
    """
    said = []
    for path in map(Path, pairs):
        run = _margins(path)
        if run.is_empty():
            continue
        mine = mismatch_tokens([path]).select("request", "position", "rollout_logprob")
        differ = mine.join(run, on=["request", "position"], how="left").filter(
            pl.col("run_logprob").ne_missing(pl.col("rollout_logprob"))
        )
        if differ.height:
            row, folder = differ.row(0, named=True), path.parent.parent / path.stem
            said.append(
                f"{path}: sample_id {row['request']!r}, inference_logprobs[{row['position']}] is {row['rollout_logprob']!r} where "
                f"the run {folder} holds {row['run_logprob']!r} ({differ.height} {'token differs' if differ.height == 1 else 'tokens differ'}): these pairs are not of this run; "
                f"rewrite them with bia experiment -o {path.parent.parent} --trainer --recompute {folder} --force"
            )
    return said


def mismatch_summaries(pairs: Sequence[str | os.PathLike[str]]) -> pl.DataFrame:
    """:func:`analysis.mismatch_summary` of each pairs file, one column per run: a row per ``framework`` and ``logged name``.

    Parameters
    ----------
    pairs : sequence of str or path
        Sampler-trainer pairs files.

    Returns
    -------
    polars.DataFrame

    Examples
    --------
    >>> table = mismatch_summaries(["data/experiment-cpu/trainer/fixed-tiles.jsonl"])
    >>> table.filter(pl.col("logged name") == "rollout_corr/k3_kl").row(0)
    ('verl', 'rollout_corr/k3_kl', 0.0)
    """
    columns = {}
    for path in map(Path, pairs):
        summary = mismatch_summary(_read(path)).row(0, named=True)
        columns[_label(path)] = [
            float(v) + 0.0 if v is not None else None for v in summary.values()
        ]  # + 0.0: -0.0 reads 0
        names = list(summary)
    if not columns:
        return pl.DataFrame(schema={"framework": pl.String, "logged name": pl.String})
    return pl.DataFrame(
        {
            "framework": [n.split(":", 1)[0] for n in names],
            "logged name": [n.split(":", 1)[1] for n in names],
            **columns,
        }
    )


def largest_k3(pairs: Sequence[str | os.PathLike[str]], n: int = TOP_SEQUENCES) -> pl.DataFrame:
    """Per pairs file, the ``n`` sequences with the largest K3 (their token mean), with where their tokens parted.

    Parameters
    ----------
    pairs : sequence of str or path
        Sampler-trainer pairs files.
    n : int, default 5
        Sequences kept per file.

    Returns
    -------
    polars.DataFrame

    Examples
    --------
    >>> largest_k3(["data/experiment-cpu/trainer/default.jsonl"], n=1).columns
    ['run', 'request', 'prompt_id', 'c', 'tokens', 'tokens parted', 'first parted at', 'K3 (token mean)', 'max |delta|']
    """
    frames = []
    for path in map(Path, pairs):
        dump = _read(path)
        table = mismatch_table(dump).select("sequence", "tokens", "k3")
        keys = dump.requests.select(
            pl.concat_str("source", "record", "choice_index", separator=":").alias("sequence"), request="sample_key"
        )
        frames.append(table.join(keys, on="sequence").drop("sequence").with_columns(run=pl.lit(_label(path))))
    if not frames:
        return pl.DataFrame()
    tokens = (
        mismatch_tokens(pairs)
        .group_by("run", "request")
        .agg(
            "prompt_id",
            "c",
            (pl.col("delta") != 0).sum().alias("tokens parted"),
            pl.col("position").filter(pl.col("delta") != 0).min().alias("first parted at"),
            pl.col("delta").abs().max().alias("max |delta|"),
        )
    )
    per = pl.concat(frames).join(
        tokens.with_columns(pl.col("prompt_id", "c").list.first()), on=["run", "request"], how="left"
    )
    top = per.sort("k3", descending=True, nulls_last=True).group_by("run", maintain_order=True).head(n)
    return top.select(
        "run",
        "request",
        "prompt_id",
        "c",
        "tokens",
        "tokens parted",
        "first parted at",
        pl.col("k3").alias("K3 (token mean)"),
        "max |delta|",
    ).sort("run", "K3 (token mean)", descending=[False, True])
