"""One block's sums of the mismatch metrics' per-token pass in numpy: the per-run sums and the batch-wide row.

:func:`block_sums` computes on a block's loss-masked tokens every per-token quantity once (``δ``, ``ρ``,
``exp t``, ``exp r``, K3...) into the rows of one array and reduces them at once: per run of equal
``sequence`` with ``numpy.add.reduceat``, batch-wide with sums, two-pass second moments, a co-moment,
maxima and minima. :func:`run_fields` and :data:`ROW_FIELDS` name the rows of what it gives, which
:mod:`~analysis.metrics.mismatch._mismatch_kernel` gives alike; :mod:`~analysis.metrics.mismatch._mismatch_blocks`
cuts the streamed batches into blocks and merges their sums.
"""

from __future__ import annotations

import numpy as np

from ._mismatch import ADV_SUMS, GLOBAL_MAX, GLOBAL_SUMS, Constants

#: The rows of a block's per-token array that are summed per sequence, in order (prime-rl's ADV_SUMS go between,
#: with an advantage); then the GLOBAL_M2 quantities, whose first two, |δ| and K3, are also summed; then Δp = p − q.
_SEQ_ROWS = ("s_r", "s_t", "s_d", "s_miles", "s_rho2", "s_tis", "n_tisclip", "s_tisabs")
_MOMENT_ROWS = ("absd", "k3", "x", "p", "q")  # the names of _mismatch.GLOBAL_M2, which merge_globals reads by name


def run_fields(advantage: bool) -> tuple[str, ...]:
    """The rows of :func:`block_sums`' per-run array, in order: the counts, then the sums of ``_SEQ_ROWS``, prime-rl's, |δ| and K3.

    Parameters
    ----------
    advantage : bool
        Include the advantage's sums.

    Returns
    -------
    tuple of str

    Examples
    --------
    >>> run_fields(False)[:4], run_fields(True)[-3:]
    (('n_rows', 'n', 'n_support', 's_r'), ('s_k3k', 's_absd', 's_k3'))
    """
    return ("n_rows", "n", "n_support", *_SEQ_ROWS, *(ADV_SUMS if advantage else ()), "s_absd", "s_k3")


#: The entries of :func:`block_sums`' batch-wide row, in order.
ROW_FIELDS = (
    *GLOBAL_SUMS,
    *(f"g_{name}" for name in _MOMENT_ROWS),
    *(f"m2_{name}" for name in _MOMENT_ROWS),
    "c2_pq",
    *(f"max_{name}" for name in GLOBAL_MAX),
    "min_absd",
)


def _lengths(starts: np.ndarray, total: int) -> np.ndarray:
    """The length of each run that begins at ``starts``, the last running to ``total``."""
    out = np.empty(len(starts))
    np.subtract(starts[1:], starts[:-1], out=out[:-1])
    out[-1] = total - starts[-1]
    return out


def block_sums(
    starts: np.ndarray,
    mask: np.ndarray,
    r: np.ndarray,
    t: np.ndarray,
    advantage: np.ndarray | None,
    support: np.ndarray | None,
    c: Constants = Constants(),
) -> tuple[np.ndarray, np.ndarray]:
    """One block's per-run sums (a run: rows of one sequence, starting at ``starts``, the first at 0) and its batch-wide row.

    The per-run array has a row per :func:`run_fields`: the SEQ_SUMS (and the ADV_SUMS given an
    advantage) of :mod:`~analysis.metrics.mismatch._mismatch`, each over the run's loss-masked tokens
    (``n_rows`` and ``n_support`` over all its rows). The batch-wide row (:data:`ROW_FIELDS`) holds the
    GLOBAL_SUMS, and for each GLOBAL_M2 quantity its Σ (``g_``) and its second moment about the
    block's own mean (``m2_``), the co-moment of ``p`` and ``q`` (``c2_pq``), then the GLOBAL_MAX
    maxima and ``min_absd`` (NaN without a masked token).

    Parameters
    ----------
    starts : numpy.ndarray
        The row where each run starts, increasing, the first 0.
    mask : numpy.ndarray
        The loss mask, booleans.
    r, t : numpy.ndarray
        The rollout's and the trainer's logprobs.
    advantage : numpy.ndarray or None
        The advantage per token, or None without one.
    support : numpy.ndarray or None
        Whether each token's trainer logprob was replayed on a support, or None.
    c : Constants, default Constants()
        The frameworks' constants.

    Returns
    -------
    tuple of numpy.ndarray
        The per-run array (fields x runs) and the batch-wide row.

    Examples
    --------
    >>> import math
    >>> mask = np.array([True, True, True, False])
    >>> r, t = np.log([0.25, 0.5, 0.8, 1.0]), np.log([0.75, 0.5, 0.2, 1.0])
    >>> runs, row = block_sums(np.array([0, 2]), mask, r, t, None, None)
    >>> runs = dict(zip(run_fields(False), runs))
    >>> runs["n_rows"].tolist(), runs["n"].tolist(), runs["s_tis"].round(12).tolist()  # rho = 3, 1 | 1/4
    ([2.0, 2.0], [2.0, 1.0], [4.0, 0.25])
    >>> row = dict(zip(ROW_FIELDS, row.tolist()))
    >>> row["n"], round(row["max_absd"], 12) == round(math.log(4), 12), row["n_sky"]
    (3.0, True, 1.0)
    """
    masked = np.flatnonzero(mask)
    at = np.searchsorted(masked, starts)  # where each run's loss-masked tokens begin among the block's
    count = _lengths(at, len(masked))
    with np.errstate(all="ignore"):  # IEEE results as polars gives them: exp overflows to inf, NaN propagates
        rows, rc = _token_rows(r[masked], t[masked], advantage[masked] if advantage is not None else None, c)
    fields = run_fields(advantage is not None)
    runs = np.zeros((len(fields), len(starts)))
    runs[0], runs[1] = _lengths(starts, len(mask)), count
    if support is not None:
        runs[2] = np.add.reduceat(support.astype(np.float64), starts)
    some = count > 0
    if some.all():
        runs[3:] = np.add.reduceat(rows[: len(fields) - 3], at, axis=1)
    elif some.any():  # reduceat gives an empty run the next run's first value: it sees the non-empty runs only
        runs[3:, some] = np.add.reduceat(rows[: len(fields) - 3], at[some], axis=1)
    with np.errstate(all="ignore"):  # inf − inf in a moment is NaN, as in the sums
        return runs, _batch_row(rows[-len(_MOMENT_ROWS) - 1 : -1], rc, c)


def _token_rows(
    r: np.ndarray, t: np.ndarray, advantage: np.ndarray | None, c: Constants
) -> tuple[np.ndarray, np.ndarray]:
    """Every per-token quantity of the loss-masked tokens, a row each (see ``_SEQ_ROWS``), and exp(clip(δ)).

    ``r`` and ``t`` may be float32: they are widened (exactly) as they are copied into their float64 rows.
    """
    extra = len(ADV_SUMS) if advantage is not None else 0
    rows = np.empty((len(_SEQ_ROWS) + extra + len(_MOMENT_ROWS) + 1, len(r)))
    r_, t_, d, miles, rho2, rho, tisclip, tisabs = rows[: len(_SEQ_ROWS)]
    absd, k3, x, p, q, pminus = rows[-len(_MOMENT_ROWS) - 1 :]
    r_[:], t_[:] = r, t
    r, t = r_, t_
    np.subtract(t, r, out=d)
    np.exp(d, out=rho)
    np.exp(t, out=p)
    np.exp(r, out=q)
    np.subtract(rho, 1.0, out=k3)
    np.subtract(k3, d, out=k3)  # K3 = (ρ − 1) − δ
    np.abs(d, out=absd)
    np.subtract(p, q, out=pminus)
    np.abs(pminus, out=x)
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
    if (
        advantage is not None
    ):  # prime-rl: masked when Δp > high for a positive advantage, Δp < −low otherwise (null: otherwise)
        n_pm, n_ph, n_pl, s_k3m, s_k3k = rows[len(_SEQ_ROWS) : len(_SEQ_ROWS) + extra]
        positive, high, low = advantage > 0, pminus > c.prime_rl_dppo_mask_high, pminus < -c.prime_rl_dppo_mask_low
        dropped = np.where(positive, high, low)
        n_pm[:] = dropped
        np.logical_and(positive, high, out=n_ph)
        np.logical_and(advantage < 0, low, out=n_pl)
        np.multiply(dropped, k3, out=s_k3m)  # products, not np.where: an infinite K3 gives NaN as before
        np.multiply(~dropped, k3, out=s_k3k)
    return rows, rc


def _batch_row(moments: np.ndarray, rc: np.ndarray, c: Constants) -> np.ndarray:
    """The batch-wide row of a block's loss-masked tokens (:data:`ROW_FIELDS`), from its GLOBAL_M2 rows and exp(clip(δ))."""
    n = len(rc)
    totals = moments.sum(axis=1)
    centred = moments - (totals / n)[:, None] if n else moments
    if (
        c.verl_rollout_is == "token"
    ):  # the token-level IS weights; the sequence level takes them from the per-sequence Σδ
        w = np.minimum(rc, c.verl_is_threshold)
        weights: tuple[float | np.integer, ...] = (
            w.sum(),
            np.einsum("i,i->", w, w),
            np.count_nonzero(rc > c.verl_is_threshold),
            np.count_nonzero(rc < 1.0 / c.verl_is_threshold),
        )
    else:
        weights = (np.nan,) * 4
    sums = (n, *weights, np.count_nonzero(rc > c.skyrl_token_tis_ratio_clip_high), rc.sum())
    extremes = (*moments[: len(GLOBAL_MAX)].max(axis=1), moments[0].min()) if n else (np.nan,) * (len(GLOBAL_MAX) + 1)
    # einsum, not a BLAS dot: BLAS's threads spin for seconds on a busy machine
    p, q = centred[_MOMENT_ROWS.index("p")], centred[_MOMENT_ROWS.index("q")]
    return np.concatenate(
        (sums, totals, np.einsum("ij,ij->i", centred, centred), (np.einsum("i,i->", p, q),), extremes)
    )
