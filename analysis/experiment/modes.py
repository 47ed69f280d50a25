"""The experiment's and ``bia serve``'s kernel modes (no torch needed to name them).

Kernel modes:

- ``default``: the batch runs through every layer together, as a serving engine does; torch picks
  its kernels by the batch's shape, so a row's bits may depend on how many rows it shares a
  matmul with.
- ``one-by-one`` (``batch-invariant`` until this mode had a batched sibling; the old name is still
  accepted): every request runs through the same arithmetic as it would alone — each row is its
  own batch of one at every layer (the matmul shapes of a single request). A row's bits are then
  independent of the batch by construction; the cost is decode rate, which the run records.
- ``fixed-tiles``: the batch runs through every layer together, on kernels whose every reduction
  has a shape fixed in advance (row tiles, attention splits; :mod:`.model.kernels`), so a row's bits are
  independent of the batch and the batch keeps its matmuls.
- ``row-invariant``: the batch runs through every layer together, each Linear one GEMM over all of
  its rows (at least 4, where the BLAS sums every row in one order) and each query alone against
  its own keys in fixed splits (:mod:`.model.rowwise`): a row's bits are independent of the batch, and a
  prompt's one-pass forward (prefill) gives every token the bits its decode step gave, at about
  the default mode's cost.

:data:`INVARIANT_MODES` names the modes that claim batch invariance, :data:`PREFILL_DECODE_MODES` those of them
whose one-pass forward over prompt and completion also claims the decode steps' bits (tests parametrize over them).
"""

from __future__ import annotations

from ..core import INVARIANT_MODES, KERNEL_MODES, MODE_ALIASES, PREFILL_DECODE_MODES

__all__ = ["INVARIANT_MODES", "KERNEL_MODES", "MODE_ALIASES", "PREFILL_DECODE_MODES", "kernel_mode"]


def kernel_mode(name: str) -> str:
    """The kernel mode ``name`` selects (an alias gives its mode); ValueError for any other name.

    Parameters
    ----------
    name : str
        A kernel mode or an alias.

    Returns
    -------
    str

    Examples
    --------
    >>> kernel_mode("batch-invariant")
    'one-by-one'
    >>> kernel_mode("fast")
    Traceback (most recent call last):
    ...
    ValueError: mode must be one of default, one-by-one, fixed-tiles, row-invariant (or batch-invariant for one-by-one), got 'fast'
    """
    if name in KERNEL_MODES:
        return name
    if name in MODE_ALIASES:
        return MODE_ALIASES[name]
    aliases = ", ".join(f"{a} for {m}" for a, m in MODE_ALIASES.items())
    raise ValueError(f"mode must be one of {', '.join(KERNEL_MODES)} (or {aliases}), got {name!r}")
