"""Witnesses: aprender's parity receipts and release markers, read into five frames (:class:`WitnessSet`)."""

from ._read import WitnessSet, read_witness, read_witnesses
from ._schema import MARKER_KEYS

__all__ = ["MARKER_KEYS", "WitnessSet", "read_witness", "read_witnesses"]
