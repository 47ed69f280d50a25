"""The per-token pass of the mismatch metrics as one compiled loop (numba), the same sums as :func:`~analysis.metrics._mismatch_blocks.block_sums`.

The numpy pass makes about seventy passes over each 16 Ki-row block (a temporary row per
quantity); this loop reads each token once, computes ``δ``, the three ``exp`` and every derived
quantity in registers, and adds them to its run's sums. Only the five quantities whose second
moments the batch-wide row needs are kept, in a block-sized scratch array (640 KiB, in a core's
cache), so that they are centred on the block's own mean in a second pass, exactly as the numpy
pass does: the merged moments (Chan's formula) see the same per-block rows.

numba is an optional dependency (``pip install 'bia[fast]'``): it caps numpy's version and brings
LLVM (about 50 MB), which the report does not need. Without it the numpy pass runs. The compiled
code is cached on disk (``cache=True``), so only the first process after an install pays the
compile (about 2 s of CPU).

Each value is the numpy pass's up to rounding: a run's sums and the batch-wide sums add the same
terms, sequentially here and pairwise in numpy (tests/test_mismatch_kernel.py checks the two agree
to 1e-12 relative).
"""

from __future__ import annotations

import math

import numpy as np

try:
    import numba
except ImportError:  # the numpy pass runs instead
    numba = None

#: Whether the compiled pass is available (numba importable).
AVAILABLE = numba is not None

# Where each quantity goes in a run's row of sums: the order of _mismatch_blocks.run_fields, the prime-rl ADV_SUMS
# (present with an advantage) between s_tisabs and s_absd.
_N_ROWS, _N, _N_SUPPORT, _S_R, _S_T, _S_D, _S_MILES, _S_RHO2, _S_TIS, _C_TISCLIP, _S_TISABS = range(11)
# The entries of the batch-wide row (_mismatch_blocks.ROW_FIELDS): GLOBAL_SUMS, then Σ and M2 of absd, k3, x, p, q,
# then c2_pq, the maxima of absd, k3, x and the minimum of absd.
_G_N, _G_SW, _G_SW2, _G_CHI, _G_CLO, _G_CSKY, _G_SRC = range(7)
_G_TOTALS, _G_M2, _G_C2, _G_MAX, _G_MIN = 7, 12, 17, 18, 21
_ROW_WIDTH = 22


def _clip(v, lo, hi):
    # NaN passes through, as with np.clip
    return lo if v < lo else (hi if v > hi else v)


def _run_sums(begin, end, mask, r, t, adv, support, c, runs, j, scratch, k):
    """Add the run's tokens (rows begin to end) into ``runs[:, j]``; each masked token's moment quantities go to
    ``scratch[:, k]`` onward. Returns the new k and the block's batch-wide sums (verl's weights, SkyRL's count, Σ rc)."""
    safety, clamp, tis_hi, tis_lo, dppo_hi, dppo_lo, verl_thr, sky_hi = c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]
    has_adv, has_support = adv.shape[0] > 0, support.shape[0] > 0
    tail = runs.shape[0] - 2  # s_absd, s_k3 are the last two rows
    s_w = s_w2 = c_hi = c_lo = c_sky = s_rc = 0.0
    n = 0
    for i in range(begin, end):
        if has_support and support[i]:
            runs[_N_SUPPORT, j] += 1.0
        if not mask[i]:
            continue
        ri, ti = np.float64(r[i]), np.float64(t[i])
        d = ti - ri
        rho, p, q = math.exp(d), math.exp(ti), math.exp(ri)
        k3 = (rho - 1.0) - d
        absd = abs(d)
        pminus = p - q
        if absd > safety:  # verl's, slime's, SkyRL's and miles' clip of the log-ratio
            dc = _clip(d, -safety, safety)
            rc = math.exp(dc)
            miles = _clip((rc - 1.0) - dc, -clamp, clamp)
        else:
            rc = rho
            miles = _clip(k3, -clamp, clamp)
        n += 1
        runs[_S_R, j] += ri
        runs[_S_T, j] += ti
        runs[_S_D, j] += d
        runs[_S_MILES, j] += miles
        runs[_S_RHO2, j] += rc * rc
        runs[_S_TIS, j] += rho
        runs[_C_TISCLIP, j] += 1.0 if (rho > tis_hi or rho < tis_lo) else 0.0
        runs[_S_TISABS, j] += abs(rho - 1.0)
        if has_adv:  # prime-rl: masked when Δp > high for a positive advantage, Δp < −low otherwise
            a = adv[i]
            high, low = pminus > dppo_hi, pminus < -dppo_lo
            dropped = high if a > 0 else low
            runs[_S_TISABS + 1, j] += 1.0 if dropped else 0.0
            runs[_S_TISABS + 2, j] += 1.0 if (a > 0 and high) else 0.0
            runs[_S_TISABS + 3, j] += 1.0 if (a < 0 and low) else 0.0
            runs[_S_TISABS + 4, j] += (1.0 if dropped else 0.0) * k3  # a product: an infinite K3 gives NaN as numpy does
            runs[_S_TISABS + 5, j] += (0.0 if dropped else 1.0) * k3
        runs[tail, j] += absd
        runs[tail + 1, j] += k3
        w = verl_thr if rc > verl_thr else rc  # np.minimum: NaN stays NaN
        s_w += w
        s_w2 += w * w
        c_hi += 1.0 if rc > verl_thr else 0.0
        c_lo += 1.0 if rc < 1.0 / verl_thr else 0.0
        c_sky += 1.0 if rc > sky_hi else 0.0
        s_rc += rc
        scratch[0, k], scratch[1, k], scratch[2, k], scratch[3, k], scratch[4, k] = absd, k3, abs(pminus), p, q
        k += 1
    runs[_N_ROWS, j] = end - begin
    runs[_N, j] = n
    return k, s_w, s_w2, c_hi, c_lo, c_sky, s_rc


def _finish_block(row, scratch, n, verl_token):
    """The block's moments from its ``n`` scratch columns: Σ, M2 about the block's mean, the co-moment, the extremes."""
    row[_G_N] = n
    if not verl_token:
        row[_G_SW] = row[_G_SW2] = row[_G_CHI] = row[_G_CLO] = np.nan
    for m in range(5):
        total = 0.0
        for k in range(n):
            total += scratch[m, k]
        row[_G_TOTALS + m] = total
    if n == 0:
        for m in range(4):
            row[_G_MAX + m] = np.nan
        return
    for m in range(5):
        mean = row[_G_TOTALS + m] / n
        m2 = 0.0
        for k in range(n):
            v = scratch[m, k] - mean
            m2 += v * v
        row[_G_M2 + m] = m2
    mp, mq = row[_G_TOTALS + 3] / n, row[_G_TOTALS + 4] / n
    c2 = 0.0
    for k in range(n):
        c2 += (scratch[3, k] - mp) * (scratch[4, k] - mq)
    row[_G_C2] = c2
    for m in range(3):  # np.max: a NaN wins
        top = -np.inf
        for k in range(n):
            v = scratch[m, k]
            if v != v:
                top = v
                break
            if v > top:
                top = v
        row[_G_MAX + m] = top
    low = np.inf
    for k in range(n):
        v = scratch[0, k]
        if v != v:
            low = v
            break
        if v < low:
            low = v
    row[_G_MIN] = low


def _batch_kernel(firsts, block_rows, mask, r, t, adv, support, c, verl_token, runs, rows):
    """Every run's sums (``runs[:, j]`` for the run starting at ``firsts[j]``) and every block's row (``rows[b]``)."""
    height = mask.shape[0]
    scratch = np.empty((5, min(block_rows, height)))
    block, k = 0, 0
    for j in range(firsts.shape[0]):
        begin = firsts[j]
        end = firsts[j + 1] if j + 1 < firsts.shape[0] else height
        if begin // block_rows != block:  # a new block: the previous one's moments
            _finish_block(rows[block], scratch, k, verl_token)
            block, k = begin // block_rows, 0
        row = rows[block]
        k, s_w, s_w2, c_hi, c_lo, c_sky, s_rc = _run_sums(begin, end, mask, r, t, adv, support, c, runs, j, scratch, k)
        row[_G_SW] += s_w
        row[_G_SW2] += s_w2
        row[_G_CHI] += c_hi
        row[_G_CLO] += c_lo
        row[_G_CSKY] += c_sky
        row[_G_SRC] += s_rc
    _finish_block(rows[block], scratch, k, verl_token)


if AVAILABLE:
    _jit = numba.njit(cache=True, nogil=True, error_model="numpy")
    _clip = _jit(_clip)
    _run_sums = _jit(_run_sums)
    _finish_block = _jit(_finish_block)
    _batch_kernel = _jit(_batch_kernel)


def batch_sums(firsts: np.ndarray, block_rows: int, mask: np.ndarray, r: np.ndarray, t: np.ndarray, advantage: np.ndarray | None,
               support: np.ndarray | None, constants, n_fields: int, n_row: int) -> tuple[np.ndarray, np.ndarray]:
    """A batch's per-run sums (``n_fields`` x runs) and per-block rows (blocks x ``n_row``), compiled.

    ``firsts`` are the rows where a run starts, every multiple of ``block_rows`` among them (runs do
    not cross blocks); the fields are :func:`~analysis.metrics._mismatch_blocks.run_fields` and
    :data:`~analysis.metrics._mismatch_blocks.ROW_FIELDS`, in their order.

    Examples
    --------
    >>> from analysis.metrics._mismatch import Constants
    >>> mask = np.array([True, True, True, False])
    >>> r, t = np.log([0.25, 0.5, 0.8, 1.0]), np.log([0.75, 0.5, 0.2, 1.0])
    >>> runs, rows = batch_sums(np.array([0, 2]), 1 << 14, mask, r, t, None, None, Constants(), 13, 22)
    >>> runs[0].tolist(), runs[1].tolist(), runs[8].round(12).tolist()  # rows, masked tokens, Σρ = 3 + 1 | 1/4
    ([2.0, 2.0], [2.0, 1.0], [4.0, 0.25])
    >>> rows[0, 0], rows[0, 5]  # three masked tokens, one with ρ above SkyRL's clip 2
    (3.0, 1.0)
    """
    c = constants
    packed = np.array([c.safety_bound, c.miles_kl_clamp, c.slime_tis_clip, c.slime_tis_clip_low, c.prime_rl_dppo_mask_high,
                       c.prime_rl_dppo_mask_low, c.verl_is_threshold, c.skyrl_token_tis_ratio_clip_high])
    blocks = -(-len(mask) // block_rows)
    runs = np.zeros((n_fields, len(firsts)))
    rows = np.zeros((blocks, n_row))
    none = np.zeros(0, dtype=np.bool_)
    _batch_kernel(firsts.astype(np.int64, copy=False), block_rows, mask, r, t, none if advantage is None else advantage,
                  none if support is None else support, packed, c.verl_rollout_is == "token", runs, rows)
    return runs, rows
