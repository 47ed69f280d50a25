"""The sampler-trainer mismatch of an RL step, as each framework logs it: :func:`mismatch_summary`, :func:`mismatch_table`.

Inputs: a token frame (polars DataFrame or LazyFrame), a Parquet path (file, glob, or a list; read in
batches with polars' streaming engine), a :class:`~analysis.Dump` whose candidates carry the trainer's
recompute (``list_kind="trainer_recompute"``), or two dumps ``(rollout, trainer)`` joined on record,
choice and position.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import polars as pl

from ...dumps import Dump
from . import _mismatch, _mismatch_blocks, _support

_KEY = ("record", "choice_index", "segment", "position")
_COLUMNS = ("sequence", "position", "rollout_logprob", "trainer_logprob", "mask")


def _seq_key() -> pl.Expr:
    return pl.concat_str(pl.col("source"), pl.col("record"), pl.col("choice_index"), separator=":").alias("sequence")


def _from_dumps(rollout: Dump, trainer: Dump | None) -> pl.LazyFrame:
    """Token rows of a dump (and of the trainer's dump scoring the same tokens), with any sampling support."""
    if rollout.backend != "polars" or (trainer is not None and trainer.backend != "polars"):
        raise ValueError("mismatch metrics read polars dumps (read_dump(..., backend='polars'))")
    tokens = rollout.tokens.filter(pl.col("segment") == "completion")
    key = ["source", *_KEY]
    frame = tokens.select(
        *key,
        _seq_key(),
        "token_id",
        pl.col("logprob").alias("rollout_logprob"),
        pl.col("loss_mask").fill_null(True).alias("mask"),
    )
    cands = rollout.candidates
    support = (
        cands.filter(pl.col("list_kind") == "sampling_support")
        .sort([*key, "list_index"])
        .group_by(key, maintain_order=True)
        .agg(support_ids=pl.col("cand_token_id"), support_logprobs=pl.col("cand_logprob"))
    )
    if trainer is None:
        recompute = cands.filter(pl.col("list_kind") == "trainer_recompute").select(
            *key, pl.col("cand_logprob").alias("trainer_logprob")
        )
        frame = frame.join(recompute, on=key, how="left")
        if support.height:
            frame = frame.join(support, on=key, how="left")
        return frame.lazy()
    tkey = list(_KEY)
    theirs = trainer.tokens.filter(pl.col("segment") == "completion").select(
        *tkey, pl.col("token_id").alias("trainer_token_id"), pl.col("logprob").alias("trainer_logprob")
    )
    frame = frame.join(theirs, on=tkey, how="left")
    differ = frame.filter(pl.col("trainer_token_id").is_not_null() & (pl.col("trainer_token_id") != pl.col("token_id")))
    if differ.height:
        row = differ.row(0, named=True)
        raise ValueError(
            f"the two dumps score different tokens at sequence {row['sequence']!r}, position {row['position']}: "
            f"{row['token_id']} against {row['trainer_token_id']}"
        )
    frame = frame.drop("trainer_token_id")
    if support.height:
        scored = (
            trainer.candidates.filter(pl.col("list_kind") != "sampling_support")
            .group_by([*tkey, "cand_token_id"])
            .agg(pl.col("cand_logprob").first())
        )
        on_support = (
            support.with_columns(i=pl.int_ranges(pl.col("support_ids").list.len()))
            .explode("support_ids", "i")
            .join(scored, left_on=[*tkey, "support_ids"], right_on=[*tkey, "cand_token_id"], how="left")
            .sort([*key, "i"])
            .group_by(key, maintain_order=True)
            .agg(trainer_support_logprobs=pl.col("cand_logprob"))
        )
        frame = frame.join(support, on=key, how="left").join(on_support, on=key, how="left")
    return frame.lazy()


def _paths(data: Any) -> list[str] | None:
    if isinstance(data, (str, os.PathLike)):
        data = [data]
    if isinstance(data, (list, tuple)) and data and all(isinstance(p, (str, os.PathLike)) for p in data):
        out = []
        for p in map(str, data):
            found = sorted(glob.glob(p)) if any(ch in p for ch in "*?[") else [p]
            out += [str(f) for q in found for f in (sorted(Path(q).glob("*.parquet")) if Path(q).is_dir() else [q])]
        if not out:
            raise FileNotFoundError(f"no Parquet file matches {data!r}")
        return out
    return None


def _tokens(data: Any) -> pl.LazyFrame:
    if isinstance(data, Dump):
        return _from_dumps(data, None)
    if isinstance(data, (list, tuple)) and len(data) == 2 and all(isinstance(d, Dump) for d in data):
        return _from_dumps(*data)
    paths = _paths(data)
    if paths is not None:
        return pl.scan_parquet(paths)
    if isinstance(data, pl.DataFrame):
        return data.lazy()
    if isinstance(data, pl.LazyFrame):
        return data
    raise TypeError(f"expected a token frame, a Parquet path, a Dump or two Dumps, got {type(data).__name__}")


def _prepare(lf: pl.LazyFrame, replay: bool) -> tuple[pl.LazyFrame, bool]:
    names = lf.collect_schema().names()
    missing = [c for c in _COLUMNS if c not in names]
    if missing:
        raise ValueError(
            f"the token frame lacks {missing}; it needs {list(_COLUMNS)} (and 'advantage' for prime-rl's masked metrics)"
        )
    if "support_ids" not in names:  # no sampling mask: nothing to check or replay, and no all-false column to read
        return lf, "advantage" in names
    return _support.check_and_replay(lf, replay_support=replay), "advantage" in names


def _check_finite(seqs: pl.DataFrame) -> None:
    bad = seqs.filter(~pl.col("s_r").is_finite() | ~pl.col("s_t").is_finite())
    if bad.height:
        raise ValueError(
            f"sequence {bad['sequence'][0]!r} has a loss-masked token without a finite rollout or trainer logprob"
        )


def _pieces(paths: list[str], piece_rows: int) -> list[tuple[str, int, int]]:
    import pyarrow.parquet as pq

    out = []
    for path in paths:
        rows = pq.ParquetFile(path).metadata.num_rows
        out += [(path, start, min(piece_rows, rows - start)) for start in range(0, rows, piece_rows)]
    return out


def _piece_tokens(path: str, offset: int, length: int, replay: bool) -> tuple[pl.LazyFrame, bool]:
    """One piece's token frame, prepared, and whether it has an advantage."""
    return _prepare(pl.scan_parquet(path).slice(offset, length), replay)


def _piece_partials(path: str, offset: int, length: int, constants: _mismatch.Constants, replay: bool, chunk_size: int):
    lf, advantage = _piece_tokens(path, offset, length, replay)
    return _mismatch_blocks.partials(lf, constants, advantage=advantage, chunk_size=chunk_size), advantage


def _partials(
    data: Any, constants: _mismatch.Constants, *, engine: str, replay: bool, chunk_size: int, piece_rows: int
):
    if engine not in ("polars", "ray"):
        raise ValueError(f"engine must be 'polars' or 'ray', got {engine!r}")
    paths = None if isinstance(data, Dump) else _paths(data)
    if paths is None:
        if engine == "ray":
            raise ValueError("engine='ray' reads Parquet files: pass a path, a glob or a list of paths")
        lf, advantage = _prepare(_tokens(data), replay)
        seqs, glob_row = _mismatch_blocks.partials(lf, constants, advantage=advantage, chunk_size=chunk_size)
    else:  # the same pieces, merged in the same order, on either engine: equal results
        pieces = _pieces(paths, piece_rows)
        if engine == "ray":
            results = _on_ray(pieces, constants, replay, chunk_size)
        else:  # one pipeline over every piece, so that no core waits at a piece's end
            prepared = [_piece_tokens(*piece, replay) for piece in pieces]
            sums = _mismatch_blocks.piece_partials(prepared, constants, chunk_size=chunk_size)
            results = list(zip(sums, (advantage for _, advantage in prepared)))
        if not results:
            lf, advantage = _prepare(pl.scan_parquet(paths), replay)
            return (*_mismatch_blocks.partials(lf, constants, advantage=advantage), advantage)
        advantage = results[0][1]
        seqs = _mismatch.merge_sequences(pl.concat([r[0][0] for r in results]))
        glob_row = _mismatch.merge_globals(pl.concat([r[0][1] for r in results]))
    _check_finite(seqs)
    return seqs, glob_row, advantage


def _on_ray(pieces, constants, replay, chunk_size):
    try:
        import ray
    except ImportError:
        raise ImportError("engine='ray' needs Ray: pip install 'bia[ray]'") from None
    if not ray.is_initialized():
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    task = ray.remote(_piece_partials)
    return ray.get(
        [task.remote(path, offset, length, constants, replay, chunk_size) for path, offset, length in pieces]
    )


def mismatch_summary(
    data: Any,
    *,
    engine: str = "polars",
    replay: bool = True,
    chunk_size: int = 1_000_000,
    piece_rows: int = 8_000_000,
    **constants: Any,
) -> pl.DataFrame:
    """Every framework's sampler-trainer mismatch metric of a step, in one row named ``framework:logged name``.

    Each metric is computed with its framework's own formula, averaging and constants (docs/rl.md
    lists them with their sources): ``verl:rollout_corr/k3_kl``, ``slime:train/train_rollout_logprob_abs_diff``,
    ``prime-rl:mismatch_kl/all/mean``, ``openrlhf:vllm_kl``, ``skyrl:policy/rollout_train_logprobs_abs_diff_mean``...
    plus ``bia:sequences``, ``bia:tokens``, ``bia:masked_tokens`` and ``bia:support_tokens``.

    Parameters
    ----------
    data
        A token frame (polars DataFrame or LazyFrame) with ``sequence``, ``position``, ``rollout_logprob``,
        ``trainer_logprob``, ``mask`` and, for prime-rl's masked metrics, ``advantage``; or a Parquet
        path, glob, folder or list of them holding such a frame (read in batches, out of core); or a
        :class:`~analysis.Dump` with the trainer's recompute; or two dumps ``(rollout, trainer)``.
        A sampling support (``token_id``, ``support_ids``, ``support_logprobs``,
        ``trainer_support_logprobs``) replays the trainer's logprob on it, as prime-rl does.
    engine : {"polars", "ray"}
        "ray" runs the Parquet pieces as Ray tasks (a local instance is started when none is);
        the pieces and their merge order are the same as with "polars", so the results are equal.
    replay : bool
        Renormalize the trainer's logprob on a recorded support (False: it already is).
    chunk_size, piece_rows : int
        Rows per streamed batch, and rows per Parquet piece.
    **constants
        The frameworks' constants, each defaulting to its framework's default: ``verl_is_threshold``
        (2.0), ``verl_rollout_is`` ("sequence"), ``safety_bound`` (20.0), ``slime_tis_clip`` (2.0),
        ``slime_tis_clip_low`` (0.0), ``slime_per_token_loss`` (False), ``miles_kl_clamp`` (10.0),
        ``prime_rl_dppo_mask_low`` and ``prime_rl_dppo_mask_high`` (0.2), ``skyrl_token_tis_ratio_clip_high`` (2.0).

    Returns
    -------
    polars.DataFrame
        One row, Float64 metrics (null where the framework would divide by zero) and Int64 counts.

    Raises
    ------
    SamplingMaskError
        A support that breaks the renderers' rules (empty row, repeated id, sampled id missing,
        probabilities not summing to 1 within 1e-4) or that the trainer's logprobs cannot replay.

    Examples
    --------
    >>> import polars as pl, analysis
    >>> step = pl.DataFrame({"sequence": [0, 0], "position": [0, 1], "rollout_logprob": [-0.1, -2.0],
    ...                      "trainer_logprob": [-0.12, -1.9], "mask": [True, True]})
    >>> s = analysis.mismatch_summary(step)
    >>> round(s["verl:rollout_corr/k3_kl"].item(), 7), round(s["slime:train/train_rollout_logprob_abs_diff"].item(), 6)
    (0.0026848, 0.06)
    """
    c = _mismatch.Constants(**constants)
    seqs, glob_row, advantage = _partials(
        data, c, engine=engine, replay=replay, chunk_size=chunk_size, piece_rows=piece_rows
    )
    return _mismatch.summary(seqs, glob_row, c, advantage=advantage)


def mismatch_table(data: Any, *, replay: bool = True, chunk_size: int = 1_000_000, **constants: Any) -> pl.DataFrame:
    """The sampler-trainer mismatch per sequence: plain means over each sequence's loss-masked tokens.

    Takes what :func:`mismatch_summary` takes. Columns: ``sequence``, ``tokens``, ``masked_tokens``,
    ``support_tokens`` (tokens whose trainer logprob was replayed on the sampler's support), ``k1``,
    ``k3``, ``abs_diff``, ``log_ratio_sum``, ``log_ppl_diff``, ``ppl_ratio``, ``chi2_token``,
    ``chi2_seq``, ``tis``, and with an advantage, prime-rl's ``is_masked`` share; null where the
    sequence has no masked token.

    Parameters
    ----------
    data
        What :func:`mismatch_summary` takes: a token frame, Parquet path(s), a dump, or two dumps.
    replay : bool, default True
        Renormalize the trainer's logprob on a recorded support (False: it already is).
    chunk_size : int, default 1_000_000
        Rows per streamed batch.
    **constants
        The frameworks' constants (see :func:`mismatch_summary`).

    Returns
    -------
    polars.DataFrame

    Examples
    --------
    >>> import polars as pl, analysis
    >>> step = pl.DataFrame({"sequence": ["a", "a", "b"], "position": [0, 1, 0], "rollout_logprob": [-0.1, -2.0, -0.5],
    ...                      "trainer_logprob": [-0.12, -1.9, -0.5], "mask": [True, True, False]})
    >>> analysis.mismatch_table(step).select("sequence", "masked_tokens", "k1").rows()
    [('a', 2, -0.04000000000000005), ('b', 0, None)]
    """
    c = _mismatch.Constants(**constants)
    seqs, _, advantage = _partials(data, c, engine="polars", replay=replay, chunk_size=chunk_size, piece_rows=8_000_000)
    return _mismatch.sequence_table(seqs, c, advantage=advantage)
