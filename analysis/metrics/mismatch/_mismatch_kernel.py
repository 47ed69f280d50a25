"""The per-token pass of the mismatch metrics compiled (numba): the sums of :func:`~analysis.metrics.mismatch._mismatch_blocks.block_sums` without its ~70 numpy passes per block.

Per chunk of a batch (the streaming engine's Arrow chunks, about 100 K rows), three steps: a
compiled loop copies the loss-masked tokens' ``δ``, ``t`` and ``r``, widened to float64, side by
side, one branch-free copy per stretch of loss-masked tokens, adding each run's Σt and Σr as they
pass (the runs of equal ``sequence`` are found beforehand, by a compiled loop on an integer key's
own buffer, by polars for any other key); numpy takes their three ``exp``, ``exp t`` and ``exp r``
in the place of ``t`` and ``r`` (vectorised, AVX-512 here, six times as fast as libm's ``exp`` one
value at a time in a compiled loop, and the numpy pass's very bits); branch-free compiled loops,
which vectorise, add each run's sums and take each block's moments (Σ from its runs' sums, then
M2 about the block's mean and the co-moment, then the extremes), as the numpy pass does, so the
merged rows (Chan's formula) are those of the same blocks of ``BLOCK_ROWS`` rows. The five float64
arrays are kept per thread. Two compiled calls per chunk, not per block: numba's dispatch of a call
with a dozen array arguments cost more than a block's arithmetic.

What kept loops scalar, found by reading their assembly: a condition joined by ``and`` or chosen
between two others (now 0/1 products), and a maximum in the same loop as the sums (now a loop of its
own, which stays scalar whatever the fast-math flags, as numba writes the comparison). With those
gone the pass takes about 7 ns a token row on one core here, 12 ns before.

numba is an optional dependency (``pip install 'bia[fast]'``): it caps numpy's version and brings
LLVM (about 50 MB), which the report does not need, and without it the numpy pass runs, with the
same values. The compiled code is cached on disk (``cache=True``, beside this file or in
``NUMBA_CACHE_DIR``): only the first process after an install compiles (about 2.5 s of CPU); each
later one pays numba's import (about 0.8 s, once per process, as for any library) and the cache load
(about 0.2 s).

Every value is the numpy pass's up to the order of the additions (in vector lanes here, pairwise in numpy):
tests/test_mismatch_kernel.py checks the two agree to 1e-11 relative.
"""

from __future__ import annotations

import threading

import numpy as np

try:
    import numba
except ImportError:  # the numpy pass runs instead
    numba = None  # type: ignore[assignment]  # the module or None, as AVAILABLE says

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


def _bit(bits, offset, i):
    """Row i's flag in an Arrow bitmap (least significant bit first) whose row 0 is bit ``offset``."""
    at = offset + i
    return (bits[at >> 3] >> (at & 7)) & 1


def _compact(firsts, mask, mask_offset, r, t, adv, d, tt, rr, aa, at, runs, safety):
    """The loss-masked tokens' δ, t, r (and advantage) side by side in ``d``, ``tt``, ``rr`` (``aa``), widened to
    float64, and each run's Σr and Σt into ``runs``; ``at[j]`` is where run j's begin among them (``at[-1]`` their
    count). Returns their count and how many have |δ| past ``safety``. ``mask`` is the rows' loss mask as an
    Arrow bitmap from bit ``mask_offset``.

    The mask is scanned for its stretches of loss-masked tokens (a completion is one), and each stretch is copied
    by a loop without a branch, which vectorises: a branch per token cost twice the time. The sums are taken here,
    while t and r pass by, so that the later loops need not read them again (numpy's exp then overwrites them)."""
    has_adv = aa.shape[0] > 0
    n, runs_count = r.shape[0], firsts.shape[0]
    k, clipped = 0, 0
    for j in range(-1, runs_count):  # the rows before the first run's (none when a block starts one), then each run's
        begin = 0 if j < 0 else firsts[j]
        end = firsts[j + 1] if j + 1 < runs_count else n
        if j >= 0:
            at[j] = k
        s_r = s_t = 0.0
        i = begin
        while i < end:
            if not _bit(mask, mask_offset, i):
                i += 1
                continue
            stop = i + 1
            while stop < end and _bit(mask, mask_offset, stop):
                stop += 1
            m = stop - i
            # views from 0: the copy loop then needs no wraparound check and vectorises
            rs, ts, dd, t2, r2 = r[i:stop], t[i:stop], d[k : k + m], tt[k : k + m], rr[k : k + m]
            for x in range(m):
                ri, ti = np.float64(rs[x]), np.float64(ts[x])
                dd[x], t2[x], r2[x] = ti - ri, ti, ri
                s_r += ri
                s_t += ti
                clipped += 1 if abs(ti - ri) > safety else 0
            if has_adv:
                src, dst = adv[i:stop], aa[k : k + m]
                for x in range(m):
                    dst[x] = src[x]
            k += m
            i = stop
        if j >= 0:
            runs[_S_R, j], runs[_S_T, j] = s_r, s_t
    at[runs_count] = k
    return k, clipped


def _run_firsts(keys, block_rows, firsts):
    """Where a run starts: where the integer key changes, and at each multiple of ``block_rows``; returns their count."""
    j, block_end = 0, 0
    for i in range(keys.shape[0]):
        if i == block_end or keys[i] != keys[i - 1]:  # a counter, not i % block_rows: a division per row costs
            firsts[j] = i
            j += 1
            if i == block_end:
                block_end += block_rows
    return j


def _run_sums(lo, hi, d, aa, rho, rc_all, p, q, c, runs, j):
    """Run j's sums over its loss-masked tokens (``lo`` to ``hi`` of the compacted arrays) into ``runs[:, j]`` (Σr and
    Σt are :func:`_compact`'s); returns the batch-wide sums they add to (verl's weights, SkyRL's count,
    Σ exp(clip(δ))) and the run's Σ|p − q|, Σp and Σq, which its block's moments are centred on.

    ``rc_all`` is exp(clip(δ)) (``rho`` itself when no token is clipped). No branch and no call in the loop: it is
    vectorised, its sums reassociated (the ``reassoc`` fast-math flag alone: NaN and infinities keep their IEEE rules)."""
    safety, clamp, tis_hi, tis_lo, dppo_hi, dppo_lo, verl_thr, sky_hi = c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]
    verl_lo = 1.0 / verl_thr
    has_adv = aa.shape[0] > 0
    # the sums live in registers while the run's tokens stream past, and are stored once at its end
    s_d = s_miles = s_rho2 = s_tis = n_tisclip = s_tisabs = s_absd = s_k3 = 0.0
    n_pm = n_ph = n_pl = s_k3m = s_k3k = 0.0
    s_w = s_w2 = n_hi = n_lo = n_sky = s_rc = s_x = s_p = s_q = 0.0
    # views from 0: an index that cannot be negative needs no wraparound check, and the loop vectorises
    d, rho, rc_all, p, q = d[lo:hi], rho[lo:hi], rc_all[lo:hi], p[lo:hi], q[lo:hi]
    if has_adv:
        aa = aa[lo:hi]
    # three loops, the third only with an advantage; the first two as one loop were no faster (measured)
    for k in range(hi - lo):
        dk, rhok, rc = d[k], rho[k], rc_all[k]
        k3 = (rhok - 1.0) - dk
        # verl's, slime's, SkyRL's and miles' clip of the log-ratio; unclipped, (rc − 1) − clip(δ) is K3 itself
        miles = _clip((rc - 1.0) - _clip(dk, -safety, safety), -clamp, clamp)
        s_d += dk
        s_miles += miles
        s_rho2 += rc * rc
        s_tis += rhok
        n_tisclip += 1.0 if (rhok > tis_hi or rhok < tis_lo) else 0.0
        s_tisabs += abs(rhok - 1.0)
        s_absd += abs(dk)
        s_k3 += k3
    for k in range(hi - lo):
        rc, pk, qk = rc_all[k], p[k], q[k]
        w = verl_thr if rc > verl_thr else rc  # np.minimum: NaN stays NaN
        s_w += w
        s_w2 += w * w
        n_hi += 1.0 if rc > verl_thr else 0.0
        n_lo += 1.0 if rc < verl_lo else 0.0
        n_sky += 1.0 if rc > sky_hi else 0.0
        s_rc += rc
        s_x += abs(pk - qk)
        s_p += pk
        s_q += qk
    if has_adv:  # prime-rl: masked when Δp > high for a positive advantage, Δp < −low otherwise
        for k in range(hi - lo):
            k3 = (rho[k] - 1.0) - d[k]
            a, pminus = aa[k], p[k] - q[k]
            # 0/1 products, not `and` nor a choice between two conditions: those branch, and kept the loop scalar
            high = 1.0 if pminus > dppo_hi else 0.0
            low = 1.0 if pminus < -dppo_lo else 0.0
            positive = 1.0 if a > 0 else 0.0  # a NaN advantage (a null) counts as not positive, as in numpy
            negative = 1.0 if a < 0 else 0.0
            dropped = positive * high + (1.0 - positive) * low
            n_pm += dropped
            n_ph += positive * high
            n_pl += negative * low
            s_k3m += dropped * k3  # a product: an infinite K3 gives NaN as numpy does
            s_k3k += (1.0 - dropped) * k3
    runs[_N, j] = hi - lo
    runs[_S_D, j], runs[_S_MILES, j] = s_d, s_miles
    runs[_S_RHO2, j], runs[_S_TIS, j], runs[_C_TISCLIP, j], runs[_S_TISABS, j] = s_rho2, s_tis, n_tisclip, s_tisabs
    if has_adv:
        runs[_S_TISABS + 1, j], runs[_S_TISABS + 2, j], runs[_S_TISABS + 3, j] = n_pm, n_ph, n_pl
        runs[_S_TISABS + 4, j], runs[_S_TISABS + 5, j] = s_k3m, s_k3k
    runs[runs.shape[0] - 2, j], runs[runs.shape[0] - 1, j] = s_absd, s_k3  # the last two rows
    return s_w, s_w2, n_hi, n_lo, n_sky, s_rc, s_x, s_p, s_q


def _finish_block(row, lo, hi, d, rho, p, q, verl_token):
    """A block's moments over its loss-masked tokens (``lo`` to ``hi``), given their Σ in ``row`` (added up from its
    runs' sums): M2 about the block's mean, the co-moment of p and q, the extremes, of |δ|, K3, |p − q|, p and q.

    Two loops: the second moments, their independent sums side by side, vectorised with the sums reassociated (the
    ``reassoc`` fast-math flag alone; a loop per sum in turn waited on each add's latency), then the extremes, which
    in the same loop kept the moments scalar (twice the time)."""
    n = hi - lo
    row[_G_N] = n
    if not verl_token:
        row[_G_SW] = row[_G_SW2] = row[_G_CHI] = row[_G_CLO] = np.nan
    if n == 0:  # numpy's: zero sums and moments, no extreme
        for m in range(4):
            row[_G_MAX + m] = np.nan
        return
    # views from 0: an index that cannot be negative needs no wraparound check, and the loops vectorise (5x faster)
    d, rho, p, q = d[lo:hi], rho[lo:hi], p[lo:hi], q[lo:hi]
    t = row[_G_TOTALS : _G_TOTALS + 5]
    m0, m1, m2, m3, m4 = t[0] / n, t[1] / n, t[2] / n, t[3] / n, t[4] / n
    v0 = v1 = v2 = v3 = v4 = c2 = 0.0
    nan0 = nan1 = nan2 = 0  # np.max and np.min give NaN where there is one; the comparisons below pass NaN over
    for k in range(n):
        a, b, x, pk, qk = abs(d[k]), (rho[k] - 1.0) - d[k], abs(p[k] - q[k]), p[k], q[k]
        v0 += (a - m0) * (a - m0)
        v1 += (b - m1) * (b - m1)
        v2 += (x - m2) * (x - m2)
        v3 += (pk - m3) * (pk - m3)
        v4 += (qk - m4) * (qk - m4)
        c2 += (pk - m3) * (qk - m4)
        nan0 += 0 if a == a else 1
        nan1 += 0 if b == b else 1
        nan2 += 0 if x == x else 1
    # The extremes compare the values' bits as integers, in an order that is the floats' (see _ordered): a float
    # maximum stays scalar whatever the fast-math flags, as numba writes the comparison; an integer one vectorises
    # (2.5x faster). A NaN's place in that order does not matter: where there is one, the extreme is NaN below.
    top0 = top1 = top2 = np.int64(-0x7FFFFFFFFFFFFFFF)
    low0 = np.int64(0x7FFFFFFFFFFFFFFF)
    for k in range(n):
        a, b, x = _ordered(abs(d[k])), _ordered((rho[k] - 1.0) - d[k]), _ordered(abs(p[k] - q[k]))
        top0 = max(top0, a)
        top1 = max(top1, b)
        top2 = max(top2, x)
        low0 = min(low0, a)
    row[_G_M2], row[_G_M2 + 1], row[_G_M2 + 2], row[_G_M2 + 3], row[_G_M2 + 4] = v0, v1, v2, v3, v4
    row[_G_C2] = c2
    row[_G_MAX] = np.nan if nan0 else _unordered(top0)
    row[_G_MAX + 1] = np.nan if nan1 else _unordered(top1)
    row[_G_MAX + 2] = np.nan if nan2 else _unordered(top2)
    row[_G_MIN] = np.nan if nan0 else _unordered(low0)


def _ordered(v):
    """A float64's bits as an int64 whose order is the floats' (−inf < … < −0.0 < 0.0 < … < inf): a negative's bits
    but the sign are flipped, as their integer order is the reverse of their magnitudes'."""
    bits = np.float64(v).view(np.int64)
    return bits ^ ((bits >> 63) & np.int64(0x7FFFFFFFFFFFFFFF))


def _unordered(key):
    """The float64 of an :func:`_ordered` key (the same flip undoes it)."""
    return np.int64(key ^ ((key >> 63) & np.int64(0x7FFFFFFFFFFFFFFF))).view(np.float64)


def _batch_kernel(
    firsts,
    block_rows,
    height,
    at,
    d,
    aa,
    rho,
    rc,
    p,
    q,
    support,
    support_offset,
    support_rows,
    c,
    verl_token,
    runs,
    rows,
):
    """Every run's sums (``runs[:, j]`` for the run starting at row ``firsts[j]``) and every block's row (``rows[b]``)."""
    block, block_lo = 0, 0
    last = runs.shape[0] - 1
    for j in range(firsts.shape[0]):
        begin = firsts[j]
        end = firsts[j + 1] if j + 1 < firsts.shape[0] else height
        if begin // block_rows != block:  # a new block: the previous one's moments
            _finish_block(rows[block], block_lo, at[j], d, rho, p, q, verl_token)
            block, block_lo = begin // block_rows, at[j]
        s_w, s_w2, n_hi, n_lo, n_sky, s_rc, s_x, s_p, s_q = _run_sums(
            at[j], at[j + 1], d, aa, rho, rc, p, q, c, runs, j
        )
        n_support = 0.0
        for i in range(begin, min(end, support_rows)):
            n_support += _bit(support, support_offset, i)
        runs[_N_ROWS, j], runs[_N_SUPPORT, j] = end - begin, n_support
        row = rows[block]
        row[_G_SW] += s_w
        row[_G_SW2] += s_w2
        row[_G_CHI] += n_hi
        row[_G_CLO] += n_lo
        row[_G_CSKY] += n_sky
        row[_G_SRC] += s_rc
        # the block's Σ of |δ|, K3, |p − q|, p and q, from its runs'
        row[_G_TOTALS] += runs[last - 1, j]
        row[_G_TOTALS + 1] += runs[last, j]
        row[_G_TOTALS + 2] += s_x
        row[_G_TOTALS + 3] += s_p
        row[_G_TOTALS + 4] += s_q
    _finish_block(rows[block], block_lo, at[firsts.shape[0]], d, rho, p, q, verl_token)


if AVAILABLE:
    _jit = numba.njit(cache=True, nogil=True, error_model="numpy")
    _clip = _jit(_clip)
    _bit = _jit(_bit)
    _ordered = _jit(_ordered)
    _unordered = _jit(_unordered)
    _compact = numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})(_compact)
    _run_firsts = _jit(_run_firsts)
    _run_sums = numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})(_run_sums)
    _finish_block = numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})(_finish_block)
    _batch_kernel = _jit(_batch_kernel)


_local = threading.local()


def _buffers(rows: int, advantage: bool) -> tuple[np.ndarray, ...]:
    """This thread's five float64 arrays of at least ``rows`` (δ, p, q, the advantage, empty without one, and ρ),
    kept between calls."""
    held = getattr(_local, "arrays", None)
    if held is None or len(held[0]) < rows:
        held = _local.arrays = [np.empty(rows) for _ in range(5)]
    d, p, q, aa, rho = held
    return d, p, q, aa if advantage else aa[:0], rho


#: A flag column as an Arrow bitmap: its bytes (least significant bit first) and the bit of its row 0.
Bits = tuple[np.ndarray, int]


def bits(flags: np.ndarray | Bits) -> Bits:
    """A flag column as an Arrow bitmap: given as one (from an Arrow array's buffer, read where it lies), or packed from
    numpy booleans.

    Parameters
    ----------
    flags : numpy.ndarray or Bits
        Booleans, or a bitmap and its bit offset.

    Returns
    -------
    Bits
        The bitmap (``uint8``, least significant bit first) and its bit offset.

    Examples
    --------
    >>> packed, offset = bits(np.array([True, False, True]))
    >>> packed.tolist(), offset
    ([5], 0)
    """
    if isinstance(flags, tuple):
        return flags
    return np.packbits(np.asarray(flags, dtype=bool), bitorder="little"), 0


def batch_sums(
    keys: np.ndarray | None,
    firsts: np.ndarray | None,
    block_rows: int,
    mask: np.ndarray | Bits,
    r: np.ndarray,
    t: np.ndarray,
    advantage: np.ndarray | None,
    support: np.ndarray | Bits | None,
    constants,
    n_fields: int,
    n_row: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A batch's run starts, per-run sums (``n_fields`` x runs) and per-block rows (blocks x ``n_row``), compiled.

    The runs are either found from integer ``keys`` (a run where the key stays the same, cut at each
    multiple of ``block_rows``), or given as ``firsts``, the rows where one starts, every multiple of
    ``block_rows`` among them (runs do not cross blocks). The fields are
    :func:`~analysis.metrics.mismatch._mismatch_blocks.run_fields` and
    :data:`~analysis.metrics.mismatch._mismatch_blocks.ROW_FIELDS`, in their order. ``mask`` and ``support``
    are numpy booleans or :data:`Bits` (an Arrow bitmap, read without unpacking it: polars' booleans
    as bytes cost its cast, and their reading, more than the bits).

    Parameters
    ----------
    keys : numpy.ndarray or None
        An integer key per row (a sequence's), or None when ``firsts`` is given.
    firsts : numpy.ndarray or None
        The rows where a run starts, or None when ``keys`` is given.
    block_rows : int
        Rows per block.
    mask : numpy.ndarray or Bits
        The loss mask.
    r, t : numpy.ndarray
        The rollout's and the trainer's logprobs.
    advantage : numpy.ndarray or None
        The advantage per token, or None without one.
    support : numpy.ndarray or Bits or None
        Whether each token's trainer logprob was replayed on a support, or None.
    constants : Constants
        The frameworks' constants.
    n_fields : int
        The per-run fields' count.
    n_row : int
        The per-block row's length.

    Returns
    -------
    tuple of numpy.ndarray

    Examples
    --------
    >>> from analysis.metrics.mismatch._mismatch import Constants
    >>> mask = np.array([True, True, True, False])
    >>> r, t = np.log([0.25, 0.5, 0.8, 1.0]), np.log([0.75, 0.5, 0.2, 1.0])
    >>> firsts, runs, rows = batch_sums(np.array([7, 7, 9, 9]), None, 1 << 14, mask, r, t, None, None, Constants(), 13, 22)
    >>> firsts.tolist(), runs[0].tolist(), runs[1].tolist(), runs[8].round(12).tolist()  # rows, masked, Σρ = 3 + 1 | 1/4
    ([0, 2], [2.0, 2.0], [2.0, 1.0], [4.0, 0.25])
    >>> rows[0, [0, 5]].tolist()  # three masked tokens, one with ρ above SkyRL's clip 2
    [3.0, 1.0]
    """
    c = constants
    packed = np.array(
        [
            c.safety_bound,
            c.miles_kl_clamp,
            c.slime_tis_clip,
            c.slime_tis_clip_low,
            c.prime_rl_dppo_mask_high,
            c.prime_rl_dppo_mask_low,
            c.verl_is_threshold,
            c.skyrl_token_tis_ratio_clip_high,
        ]
    )
    height = len(r)
    mask_bits, mask_offset = bits(mask)
    support_bits, support_offset = bits(support) if support is not None else (np.zeros(0, dtype=np.uint8), 0)
    if keys is not None:
        firsts = np.empty(height, dtype=np.int64)
        firsts = firsts[: _run_firsts(keys, block_rows, firsts)].copy()
    assert firsts is not None  # given when keys are not
    firsts = firsts.astype(np.int64, copy=False)
    runs, rows = np.zeros((n_fields, len(firsts))), np.zeros((-(-height // block_rows), n_row))
    # the whole batch in three steps, two compiled calls and numpy's exp between: calling per block cost more in
    # numba's dispatch than the block's arithmetic (a chunk of the streaming engine's 100 K rows stays in L3)
    d, p, q, aa, rho = _buffers(height, advantage is not None)
    at = np.empty(len(firsts) + 1, dtype=np.int64)
    with np.errstate(all="ignore"):
        # t and r go into p and q, which their exp then overwrites: two arrays fewer to pass through the caches
        m, clipped = _compact(
            firsts,
            mask_bits,
            mask_offset,
            r,
            t,
            aa if advantage is None else advantage,
            d,
            p,
            q,
            aa,
            at,
            runs,
            c.safety_bound,
        )
        # numpy's exp, not a compiled loop's: vectorised (AVX-512 here), six times as fast as libm's one value at a
        # time, and the numpy pass's very bits
        rho_, p_, q_ = np.exp(d[:m], out=rho[:m]), np.exp(p[:m], out=p[:m]), np.exp(q[:m], out=q[:m])
        # exp(clip(δ)): ρ itself unless a token is past the clip (the numpy pass's np.where gives the same bits)
        rc = np.exp(np.clip(d[:m], -c.safety_bound, c.safety_bound)) if clipped else rho_
        _batch_kernel(
            firsts,
            block_rows,
            height,
            at,
            d,
            aa,
            rho_,
            rc,
            p_,
            q_,
            support_bits,
            support_offset,
            height if support is not None else 0,
            packed,
            c.verl_rollout_is == "token",
            runs,
            rows,
        )
    return firsts, runs, rows
