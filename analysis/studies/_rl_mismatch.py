"""The report's sampler-vs-trainer section: every RL framework's mismatch metrics per run, the per-token
``δ = trainer − rollout`` logprob, where it falls (position, the sampler's top-1/top-2 margin), and the
sequences with the largest K3.

Its input is the sampler-trainer pairs that ``bia experiment --trainer`` writes beside the runs
(``<folder>/trainer/<run>.jsonl``, prime-rl token exports), or any prime-rl export; a run directory
beside the pairs (``<folder>/<run>/``) gives the sampler's top-k candidates, hence the margin.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import Any

import polars as pl

from ..dumps import read_dump
from ..metrics._rl import mismatch_summary, mismatch_table
from ..views._details import table_html

_TOP_SEQUENCES = 5  # per pairs file, in the largest-K3 table


def trainer_pairs(runs: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The trainer pairs written beside these runs (``RUN/../trainer/<RUN's name>.jsonl``), in the runs' order.

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
        ``run``, ``request`` (the sample id), ``prompt_id``, ``band_c``, ``position``, ``rollout_logprob``,
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
        trainer = dump.candidates.filter(pl.col("list_kind") == "trainer_recompute").select(*key, trainer_logprob="cand_logprob")
        requests = dump.requests.select(
            "source", "record", request="sample_key", prompt_id=pl.col("extra").str.json_path_match("$.prompt_id"),
            band_c=pl.col("extra").str.json_path_match("$.band_c").cast(pl.Int64, strict=False))
        tokens = (dump.tokens.filter(pl.col("segment") == "completion").select(*key, rollout_logprob="logprob")
                  .join(trainer, on=key, how="left").join(requests, on=["source", "record"], how="left"))
        frames.append(tokens.with_columns(run=pl.lit(_label(path))).join(_margins(path), on=["request", "position"], how="left"))
    schema = {"run": pl.String, "request": pl.String, "prompt_id": pl.String, "band_c": pl.Int64, "position": pl.Int64,
              "rollout_logprob": pl.Float64, "trainer_logprob": pl.Float64, "margin": pl.Float64}
    out = pl.concat([f.select(list(schema)).cast(schema) for f in frames]) if frames else pl.DataFrame(schema=schema)
    return out.with_columns(delta=pl.col("trainer_logprob") - pl.col("rollout_logprob")).select(*list(schema)[:-1], "delta", "margin")


def _margins(pairs: Path) -> pl.DataFrame:
    """Per request id and position, the sampler's top-1 minus top-2 logprob, from the run beside the pairs (empty without one)."""
    manifest = pairs.parent.parent / pairs.stem / "manifest.json"
    return _margins_once(str(manifest.parent), manifest.stat().st_mtime_ns if manifest.is_file() else None)


@functools.lru_cache(maxsize=16)
def _margins_once(folder: str, mtime_ns: int | None) -> pl.DataFrame:
    from ..run import read_run

    empty = pl.DataFrame(schema={"request": pl.String, "position": pl.Int64, "margin": pl.Float64, "run_logprob": pl.Float64})
    if mtime_ns is None:
        return empty
    run = read_run(folder)
    key = ["source", "record", "position"]
    top = (run.candidates.filter((pl.col("list_kind") == "top_logprobs") & (pl.col("segment") == "completion"))
           .group_by(key).agg(margin=pl.col("cand_logprob").top_k(2).first() - pl.col("cand_logprob").top_k(2).last()))
    own = run.tokens.filter(pl.col("segment") == "completion").select(*key, run_logprob="logprob")
    return (own.join(top, on=key, how="left").join(run.requests.select("source", "record", request="request_id"), on=["source", "record"])
            .select(empty.columns))


def stale_pairs(pairs: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Why a pairs file is not of the run beside it (the run decoded again since, or another run's pairs): one sentence per
    such file, naming its first token whose sampler logprob the run does not hold; empty when every file matches.

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
        differ = mine.join(run, on=["request", "position"], how="left").filter(pl.col("run_logprob").ne_missing(pl.col("rollout_logprob")))
        if differ.height:
            row, folder = differ.row(0, named=True), path.parent.parent / path.stem
            said.append(f"{path}: sample_id {row['request']!r}, inference_logprobs[{row['position']}] is {row['rollout_logprob']!r} where "
                        f"the run {folder} holds {row['run_logprob']!r} ({differ.height} {'token differs' if differ.height == 1 else 'tokens differ'}): these pairs are not of this run; "
                        f"rewrite them with bia experiment -o {path.parent.parent} --trainer --recompute {folder} --force")
    return said


def mismatch_summaries(pairs: Sequence[str | os.PathLike[str]]) -> pl.DataFrame:
    """:func:`analysis.mismatch_summary` of each pairs file, one column per run: a row per ``framework`` and ``logged name``.

    Examples
    --------
    >>> table = mismatch_summaries(["data/experiment-cpu/trainer/fixed-tiles.jsonl"])
    >>> table.filter(pl.col("logged name") == "rollout_corr/k3_kl").row(0)
    ('verl', 'rollout_corr/k3_kl', 0.0)
    """
    columns = {}
    for path in map(Path, pairs):
        summary = mismatch_summary(_read(path)).row(0, named=True)
        columns[_label(path)] = [float(v) + 0.0 if v is not None else None for v in summary.values()]  # + 0.0: -0.0 reads 0
        names = list(summary)
    if not columns:
        return pl.DataFrame(schema={"framework": pl.String, "logged name": pl.String})
    return pl.DataFrame({"framework": [n.split(":", 1)[0] for n in names], "logged name": [n.split(":", 1)[1] for n in names], **columns})


def largest_k3(pairs: Sequence[str | os.PathLike[str]], n: int = _TOP_SEQUENCES) -> pl.DataFrame:
    """Per pairs file, the ``n`` sequences with the largest K3 (their token mean), with where their tokens parted.

    Examples
    --------
    >>> largest_k3(["data/experiment-cpu/trainer/default.jsonl"], n=1).columns
    ['run', 'request', 'prompt_id', 'band_c', 'tokens', 'tokens parted', 'first parted at', 'K3 (token mean)', 'max |delta|']
    """
    frames = []
    for path in map(Path, pairs):
        dump = _read(path)
        table = mismatch_table(dump).select("sequence", "tokens", "k3")
        keys = dump.requests.select(pl.concat_str("source", "record", "choice_index", separator=":").alias("sequence"),
                                    request="sample_key")
        frames.append(table.join(keys, on="sequence").drop("sequence").with_columns(run=pl.lit(_label(path))))
    if not frames:
        return pl.DataFrame()
    tokens = mismatch_tokens(pairs).group_by("run", "request").agg(
        "prompt_id", "band_c", (pl.col("delta") != 0).sum().alias("tokens parted"),
        pl.col("position").filter(pl.col("delta") != 0).min().alias("first parted at"), pl.col("delta").abs().max().alias("max |delta|"))
    per = pl.concat(frames).join(tokens.with_columns(pl.col("prompt_id", "band_c").list.first()), on=["run", "request"], how="left")
    top = per.sort("k3", descending=True, nulls_last=True).group_by("run", maintain_order=True).head(n)
    return top.select("run", "request", "prompt_id", "band_c", "tokens", "tokens parted", "first parted at",
                      pl.col("k3").alias("K3 (token mean)"), "max |delta|").sort("run", "K3 (token mean)", descending=[False, True])


def rl_mismatch_html(pairs: Sequence[str | os.PathLike[str]]) -> str:
    """The section's tables: every framework's metrics per run, and the sequences with the largest K3.

    Parameters
    ----------
    pairs : sequence of paths
        Sampler-trainer pairs files (see :func:`trainer_pairs`).

    Returns
    -------
    str
        Escaped HTML: a heading, a sentence per run on whether it reached exactly 0, and the two tables.

    Examples
    --------
    >>> html = rl_mismatch_html(["data/experiment-cpu/trainer/fixed-tiles.jsonl"])
    >>> "experiment-cpu/fixed-tiles: every one of the 3968 tokens" in html
    True
    """
    summaries = mismatch_summaries(pairs)
    tokens = mismatch_tokens(pairs)
    said = []
    for (run,), group in tokens.group_by("run", maintain_order=True):
        parted = int((group["delta"] != 0).sum())
        said.append(f"{run}: every one of the {group.height} tokens has the sampler's bits, so every metric is at its no-mismatch value"
                    if parted == 0 else f"{run}: {parted} of {group.height} tokens part, by up to {group['delta'].abs().max():.3g} nats")
    intro = ("<h2>Sampler and trainer</h2><p>Each sampled sequence scored again as an RL trainer scores it: one teacher-forced "
             "forward pass over prompt and completion, batched as a trainer batches, in the run's kernel mode. The metrics are each "
             "framework's own (names as they log them, their averaging and constants); delta is the trainer's logprob minus the "
             "sampler's. A kernel mode whose one-pass forward gives the decode's bits makes every one exactly 0.</p>")
    findings = "<ul>" + "".join(f"<li>{escape(s)}</li>" for s in said) + "</ul>"
    findings += "".join(f'<p class="bia-fail">{escape(s)}</p>' for s in stale_pairs(pairs))
    summary = table_html(summaries, caption="Every framework's sampler-trainer mismatch metrics, one column per run. With no "
                                            "mismatch a difference or KL reads 0 and a ratio 1; verl divides its token means by "
                                            "the token count + 1e-8, so its chi2_token reads a hair below 0 even then.",
                         empty="No sampler-trainer pairs.")
    top = table_html(largest_k3(pairs), caption=f"The {_TOP_SEQUENCES} sequences of each run with the largest K3 (token mean); "
                                                 "'first parted at' is the first completion token whose logprob differs in any bit.",
                     empty="No sampler-trainer pairs.")
    return intro + findings + summary + top


def rl_mismatch_figures(pairs: Sequence[str | os.PathLike[str]]) -> list[tuple[Any, str]]:
    """The section's figures, for :func:`~analysis.report.show_figure`: the distribution of ``|delta|`` (log scale) and
    ``|delta|`` against position; ``|delta|`` against the sampler's top-1/top-2 margin.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> figures = rl_mismatch_figures(["data/experiment-cpu/trainer/default.jsonl"])
    >>> [len(fig.axes) for fig, _ in figures]
    [2, 1]
    >>> plt.close("all")
    """
    import matplotlib.pyplot as plt

    tokens = mismatch_tokens(pairs).with_columns(size=pl.col("delta").abs())
    runs = tokens["run"].unique(maintain_order=True).to_list()
    tokens = tokens.with_columns(color=pl.col("run").replace_strict(runs, [f"C{i % 10}" for i in range(len(runs))]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    _distribution(tokens, axes[0])
    _by_position(tokens, axes[1])
    out = [(fig, "the distribution of |trainer - rollout logprob| per run on a log scale, and its mean against the token's position")]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    _by_margin(tokens, ax)
    return [*out, (fig, "|trainer - rollout logprob| against the sampler's top-1 minus top-2 logprob margin, per run")]


def _zeros(group: pl.DataFrame) -> str:
    """A run's legend label, saying how many tokens sit at exactly 0 (which a log scale cannot show)."""
    run, zeros = group["run"][0], int((group["size"] == 0).sum())
    return f"{run} ({zeros} of {group.height} at exactly 0)" if zeros else run


def _each_run(tokens: pl.DataFrame):
    """Each run's tokens, its colour (the same in every panel) and its legend label."""
    for (_,), group in tokens.group_by("run", maintain_order=True):
        yield group, group["color"][0], _zeros(group)


def _distribution(tokens: pl.DataFrame, ax) -> None:
    import numpy as np

    nonzero = tokens.filter(pl.col("size") > 0)["size"]
    if nonzero.is_empty():
        ax.bia_empty = "No token's logprob differs between sampler and trainer: no distribution of |delta| to draw."
        return
    bins = np.logspace(np.log10(nonzero.min()) - 0.1, np.log10(nonzero.max()) + 0.1, 30)
    for group, color, label in _each_run(tokens):
        ax.hist(group.filter(pl.col("size") > 0)["size"].to_numpy(), bins=bins, histtype="step", color=color, label=label)
    ax.set(xscale="log", xlabel="|trainer - rollout logprob| (nats)", ylabel="tokens", title="Per-token mismatch")
    ax.legend(fontsize="small")


def _by_position(tokens: pl.DataFrame, ax) -> None:
    if tokens.filter(pl.col("size") > 0).is_empty():
        ax.bia_empty = "No token's logprob differs between sampler and trainer at any position."
        return
    for group, color, label in _each_run(tokens):
        means = group.group_by("position").agg(pl.col("size").mean()).sort("position").filter(pl.col("size") > 0)
        ax.plot(means["position"].to_numpy(), means["size"].to_numpy(), marker=".", color=color, label=label)
    ax.set(yscale="log", xlabel="completion token", ylabel="mean |trainer - rollout logprob|", title="Mismatch along the sequence")
    ax.legend(fontsize="small")


def _by_margin(tokens: pl.DataFrame, ax) -> None:
    shown = tokens.filter((pl.col("size") > 0) & (pl.col("margin") > 0))
    if shown.is_empty():
        ax.bia_empty = "No token parts with a known sampler margin (the runs beside the pairs give the margins)."
        return
    for group, color, label in _each_run(tokens):
        group = group.filter((pl.col("size") > 0) & (pl.col("margin") > 0))
        ax.scatter(group["margin"].to_numpy(), group["size"].to_numpy(), s=6, alpha=0.6, color=color, label=label)
    ax.set(xscale="log", yscale="log", xlabel="sampler's top-1 minus top-2 logprob", ylabel="|trainer - rollout logprob|",
           title="Mismatch against the sampler's margin")
    ax.legend(fontsize="small")
