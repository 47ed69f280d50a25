"""Witnesses: aprender's parity receipts and release markers, read into five frames (:class:`WitnessSet`)."""

from ._read import WitnessSet, read_witness, read_witnesses

__all__ = ["WitnessSet", "read_witness", "read_witnesses"]
