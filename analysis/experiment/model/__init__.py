"""The model family of the experiment: bia's small byte-level transformer (and a Hugging Face model
behind the same interface), its kernel modes' layers (:mod:`.kernels` for ``fixed-tiles``,
:mod:`.rowwise` for ``row-invariant``), greedy decoding in any mode, and the taps that replay a run
to find the first op that differs (:func:`write_first_ops`).

Importing it imports torch; :mod:`analysis.experiment` imports it only when a decode runs.
"""

from . import kernels, rowwise
from ._decode import PACKED_KERNELS, Decoded, check_tiled, decode, step_outputs
from ._first_ops import FIRST_OPS_FILE, band_first_ops, reference_taps, steps_that_differ, write_first_ops
from ._model import Block, HFModel, ModelConfig, TinyLM, load_model
from ._taps import LAYER_OPS, Taps, tapped_ops

__all__ = [
    "FIRST_OPS_FILE",
    "LAYER_OPS",
    "PACKED_KERNELS",
    "Block",
    "Decoded",
    "HFModel",
    "ModelConfig",
    "Taps",
    "TinyLM",
    "band_first_ops",
    "check_tiled",
    "decode",
    "kernels",
    "load_model",
    "reference_taps",
    "rowwise",
    "step_outputs",
    "steps_that_differ",
    "tapped_ops",
    "write_first_ops",
]
