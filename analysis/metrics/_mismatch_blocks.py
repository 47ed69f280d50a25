"""The per-token pass of the mismatch metrics: every per-sequence sum and batch-wide moment in one read of the tokens.

polars' streaming engine reads the few columns the metrics need (the two logprobs cast to float64,
the loss mask, the sequence key, the advantage and the support flag when there are ones) in
batches; each batch is cut into blocks of :data:`BLOCK_ROWS` rows, and numpy computes on a block's
loss-masked tokens every per-token quantity once (``δ``, ``ρ``, ``exp t``, ``exp r``, K3...) and
reduces it at once: per run of equal ``sequence`` with ``numpy.add.reduceat``, batch-wide with
sums, two-pass second moments, maxima and minima. A block's intermediates (about thirty float64
arrays) stay in the CPU's cache, which is what makes this pass cheap: on 1 M-row blocks the same
operations take three to four times the CPU time (``benchmarks/bench_mismatch.py``), and the
per-token polars expressions they replace took ten times the bare scan.

A sequence cut across blocks or batches gets one partial row per piece, which
:func:`~analysis.metrics._mismatch.merge_sequences` adds; the blocks' batch-wide rows merge with
:func:`~analysis.metrics._mismatch.merge_globals`.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ._mismatch import ADV_SUMS, GLOBAL_M2, GLOBAL_MAX, GLOBAL_SUMS, SEQ_SUMS, Constants, merge_globals, merge_sequences

#: Rows per numpy block: a block's twenty-odd float64 rows (8 Ki x 8 bytes = 64 KiB each) stay in a core's L2 cache.
BLOCK_ROWS = 1 << 13

#: The per-sequence sums that count tokens, stored as Int64.
_COUNTS = frozenset(name for name in (*SEQ_SUMS, *ADV_SUMS) if not name.startswith("s_"))


def token_columns(tokens: pl.LazyFrame, *, advantage: bool = False) -> pl.LazyFrame:
    """The columns the per-token pass reads, in the types it reads them.

    ``mask`` becomes a boolean with null read as False; ``r`` and ``t`` are the rollout and trainer
    logprobs as float64 with null read as NaN (a loss-masked token without a logprob then makes its
    sequence's sums NaN, which the caller names); ``has_support`` is present only when ``tokens`` has it.

    Examples
    --------
    >>> tokens = pl.LazyFrame({"sequence": [0, 0], "rollout_logprob": [-0.1, None],
    ...                        "trainer_logprob": [-0.12, None], "mask": [True, None]})
    >>> token_columns(tokens).collect().rows()
    [(0, True, -0.1, -0.12), (0, False, nan, nan)]
    """
    names = tokens.collect_schema().names()
    logprob = {"r": "rollout_logprob", "t": "trainer_logprob"}
    return tokens.select(
        "sequence", pl.col("mask").cast(pl.Boolean).fill_null(False),
        *(pl.col(name).cast(pl.Float64).fill_null(float("nan")).alias(short) for short, name in logprob.items()),
        *([pl.col("advantage").cast(pl.Float64)] if advantage else []),
        *([pl.col("has_support").cast(pl.Boolean).fill_null(False)] if "has_support" in names else []),
    )


#: The rows of a block's per-token array that are summed per sequence, in order (prime-rl's ADV_SUMS go between,
#: with an advantage); the last seven rows are the GLOBAL_M2 quantities, whose first two, |δ| and K3, are also summed.
_SEQ_ROWS = ("s_r", "s_t", "s_d", "s_miles", "s_rho2", "s_tis", "c_tisclip", "s_tisabs")
_MOMENT_ROWS = ("absd", "k3", "x", "p", "q", "pplus", "pminus")


def block_sums(starts: np.ndarray, mask: np.ndarray, r: np.ndarray, t: np.ndarray, advantage: np.ndarray | None,
               support: np.ndarray | None, c: Constants = Constants()) -> tuple[dict[str, np.ndarray], dict[str, float | None]]:
    """One block's per-run sums (a run: rows of one sequence, starting at ``starts``) and its batch-wide row.

    The per-run sums are the :data:`~analysis.metrics._mismatch.SEQ_SUMS` (and the ADV_SUMS with an
    advantage), each over the run's loss-masked tokens (``n_rows``, ``n_support``: over all its rows);
    the batch-wide row holds the GLOBAL_SUMS, and for each GLOBAL_M2 quantity its Σ (``g_``) and its
    second moment about the block's own mean (``m2_``), and the GLOBAL_MAX maxima and ``min_absd``.

    Examples
    --------
    >>> import math
    >>> mask = np.array([True, True, True, False])
    >>> r, t = np.log([0.25, 0.5, 0.8, 1.0]), np.log([0.75, 0.5, 0.2, 1.0])
    >>> runs, row = block_sums(np.array([0, 2]), mask, r, t, None, None)
    >>> runs["n_rows"].tolist(), runs["n"].tolist(), runs["s_tis"].round(12).tolist()  # rho = 3, 1 | 1/4
    ([2.0, 2.0], [2.0, 1.0], [4.0, 0.25])
    >>> row["n"], round(row["max_absd"], 12) == round(math.log(4), 12), row["c_sky"]
    (3, True, 1.0)
    """
    masked = np.flatnonzero(mask)
    at = np.searchsorted(masked, starts)  # where each run's loss-masked tokens begin among the block's
    count = np.diff(at, append=len(masked))
    with np.errstate(all="ignore"):  # IEEE results as polars gives them: exp overflows to inf, NaN propagates
        rows, rc = _token_rows(r[masked], t[masked], advantage[masked] if advantage is not None else None, c)
    names = (*_SEQ_ROWS, *(ADV_SUMS if advantage is not None else ()), "s_absd", "s_k3")
    summed = rows[:len(names)]
    sums = np.zeros((len(names), len(starts)))
    some = count > 0
    if some.all():
        sums = np.add.reduceat(summed, at, axis=1)
    elif some.any():  # reduceat gives an empty run the next run's first value: it sees the non-empty runs only
        sums[:, some] = np.add.reduceat(summed, at[some], axis=1)
    runs = {"n_rows": np.diff(starts, append=len(mask)).astype(np.float64), "n": count.astype(np.float64),
            "n_support": (np.add.reduceat(support.astype(np.float64), starts) if support is not None
                          else np.zeros(len(starts))), **dict(zip(names, sums))}
    return runs, _batch_row(rows[-len(_MOMENT_ROWS):], rc, c)


def _token_rows(r: np.ndarray, t: np.ndarray, advantage: np.ndarray | None, c: Constants) -> tuple[np.ndarray, np.ndarray]:
    """Every per-token quantity of the loss-masked tokens, a row each (see ``_SEQ_ROWS``), and exp(clip(δ))."""
    extra = len(ADV_SUMS) if advantage is not None else 0
    rows = np.empty((len(_SEQ_ROWS) + extra + len(_MOMENT_ROWS), len(r)))
    r_, t_, d, miles, rho2, rho, tisclip, tisabs = rows[:len(_SEQ_ROWS)]
    absd, k3, x, p, q, pplus, pminus = rows[-len(_MOMENT_ROWS):]
    r_[:], t_[:] = r, t
    np.subtract(t, r, out=d)
    np.exp(d, out=rho)
    np.exp(t, out=p)
    np.exp(r, out=q)
    np.subtract(rho, 1.0, out=k3)
    np.subtract(k3, d, out=k3)  # K3 = (ρ − 1) − δ
    np.abs(d, out=absd)
    np.subtract(p, q, out=pminus)
    np.abs(pminus, out=x)
    np.add(p, q, out=pplus)
    clipped = absd > c.safety_bound
    if clipped.any():
        dc = np.clip(d, -c.safety_bound, c.safety_bound)
        rc = np.where(clipped, np.exp(dc), rho)
        np.clip((rc - 1.0) - dc, -c.miles_kl_clamp, c.miles_kl_clamp, out=miles)
    else:  # the clip does not bite: exp(clip(δ)) is ρ and miles' term is K3, the same operations on the same values
        rc = rho
        np.clip(k3, -c.miles_kl_clamp, c.miles_kl_clamp, out=miles)
    np.multiply(rc, rc, out=rho2)  # verl and slime square the clipped ratio
    np.logical_or(rho > c.slime_tis_clip, rho < c.slime_tis_clip_low, out=tisclip)
    np.subtract(rho, 1.0, out=tisabs)
    np.abs(tisabs, out=tisabs)
    if advantage is not None:  # prime-rl: masked when Δp > high for a positive advantage, Δp < −low otherwise (null: otherwise)
        c_pm, c_ph, c_pl, s_k3m, s_k3k = rows[len(_SEQ_ROWS):len(_SEQ_ROWS) + extra]
        positive, high, low = advantage > 0, pminus > c.prime_rl_dppo_mask_high, pminus < -c.prime_rl_dppo_mask_low
        dropped = np.where(positive, high, low)
        c_pm[:] = dropped
        np.logical_and(positive, high, out=c_ph)
        np.logical_and(advantage < 0, low, out=c_pl)
        np.multiply(dropped, k3, out=s_k3m)  # products, not np.where: an infinite K3 gives NaN as before
        np.multiply(~dropped, k3, out=s_k3k)
    return rows, rc


def _batch_row(moments: np.ndarray, rc: np.ndarray, c: Constants) -> dict[str, float | None]:
    """The batch-wide row of a block's loss-masked tokens (see :func:`block_sums`), from its GLOBAL_M2 rows."""
    n = len(rc)
    w = np.minimum(rc, c.verl_is_threshold)
    totals = moments.sum(axis=1)
    centred = moments - (totals / n)[:, None] if n else moments
    m2 = np.einsum("ij,ij->i", centred, centred)  # not a BLAS call: BLAS's threads spin for seconds on a busy machine
    row: dict[str, float | None] = {
        "n": n, "s_w": float(w.sum()), "s_w2": float(np.einsum("i,i->", w, w)),
        "c_hi": float(np.count_nonzero(rc > c.verl_is_threshold)), "c_lo": float(np.count_nonzero(rc < 1.0 / c.verl_is_threshold)),
        "c_sky": float(np.count_nonzero(rc > c.skyrl_token_tis_ratio_clip_high)), "s_rho_c": float(rc.sum()),
        **{f"g_{name}": float(v) for name, v in zip(_MOMENT_ROWS, totals)}, **{f"m2_{name}": float(v) for name, v in zip(_MOMENT_ROWS, m2)},
    }
    extremes = moments[:len(GLOBAL_MAX)].max(axis=1) if n else [None] * len(GLOBAL_MAX)
    row |= {f"max_{name}": None if v is None else float(v) for name, v in zip(GLOBAL_MAX, extremes)}
    row["min_absd"] = float(moments[0].min()) if n else None
    return row


def _run_starts(batch: pl.DataFrame) -> np.ndarray:
    """The rows where a run of equal ``sequence`` starts (any key type, nulls equal to each other)."""
    key = pl.col("sequence")
    return np.flatnonzero(batch.select(key.ne_missing(key.shift(1)).fill_null(True)).to_series().to_numpy())


def _glob_schema() -> dict[str, pl.DataType]:
    return {"n": pl.Int64, **{name: pl.Float64 for name in GLOBAL_SUMS if name != "n"},
            **{f"{p}_{name}": pl.Float64 for p in ("g", "m2") for name in GLOBAL_M2},
            **{f"max_{name}": pl.Float64 for name in GLOBAL_MAX}, "min_absd": pl.Float64}


def partials(tokens: pl.LazyFrame, c: Constants = Constants(), *, advantage: bool = False,
             chunk_size: int = 1_000_000) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per-sequence sums and the batch-wide row of a token frame, read in batches with polars' streaming engine.

    ``tokens`` has ``sequence``, ``rollout_logprob``, ``trainer_logprob``, ``mask``, ``advantage``
    when ``advantage`` is set, and optionally ``has_support``. Sequences come out in first-seen order.

    Examples
    --------
    >>> tokens = pl.LazyFrame({"sequence": [0, 0], "rollout_logprob": [-0.1, -2.0],
    ...                        "trainer_logprob": [-0.12, -1.9], "mask": [True, True]})
    >>> seqs, glob = partials(tokens)
    >>> seqs["n"].item(), round(seqs["s_d"].item(), 6), round(glob["max_absd"].item(), 6)
    (2, 0.08, 0.1)
    """
    keys, runs, rows = [], [], []
    fields = ("mask", "r", "t", "advantage", "has_support")
    for batch in token_columns(tokens, advantage=advantage).collect_batches(chunk_size=chunk_size, engine="streaming"):
        starts = _run_starts(batch)
        columns = {name: batch[name].to_numpy() for name in fields if name in batch.columns}
        firsts = []  # each block's first row starts a run (a piece of one), besides the batch's own run starts
        for begin in range(0, batch.height, BLOCK_ROWS):
            end = min(begin + BLOCK_ROWS, batch.height)
            block_starts = np.concatenate(([begin], starts[np.searchsorted(starts, begin, "right"):np.searchsorted(starts, end)]))
            run, row = block_sums(block_starts - begin, *(columns[name][begin:end] if name in columns else None for name in fields), c)
            firsts.append(block_starts)
            runs.append(run)
            rows.append(row)
        if firsts:
            keys.append(batch["sequence"].gather(np.concatenate(firsts)))
    names = [name for name in (*SEQ_SUMS, *ADV_SUMS) if advantage or name not in ADV_SUMS]
    key_dtype = token_columns(tokens).collect_schema()["sequence"]
    seqs = pl.DataFrame({"sequence": pl.concat(keys) if keys else pl.Series([], dtype=key_dtype),
                         **{name: np.concatenate([run[name] for run in runs]) if runs else np.zeros(0) for name in names}})
    seqs = seqs.with_columns(pl.col(name).cast(pl.Int64) for name in names if name in _COUNTS)
    if not rows:  # no token: one empty block's row
        rows = [_batch_row(np.zeros((len(_MOMENT_ROWS), 0)), np.zeros(0), c)]
    return merge_sequences(seqs), merge_globals(pl.DataFrame(rows, schema=_glob_schema()))
