"""A reproducible batch-invariance experiment in torch: a real transformer decoded greedily at
several batch sizes, in each kernel mode (``analysis.experiment.model``), written as bia run directories.

Layouts: ``copies`` fires c copies of one prompt (as aprender's probe does); ``needle`` puts the
target prompt at a seeded random position among c - 1 other prompts (as vLLM's needle test does;
only the target is recorded as the band's slot). Each mode's run goes to ``OUT/<mode>/``, named as
the mode was given (``batch-invariant/`` for the alias), its manifest's effective ``kernel_mode``
the mode it names.

Run-to-run determinism is checked first: the m=1 reference is decoded twice more and must give
identical bits, so what differs across c belongs to batching. The manifest says whether it held.
"""

from __future__ import annotations

from ._common import ExperimentError, bundled_model, check_device
from ._experiment import DEFAULT_PROMPTS, run_experiment, write_first_ops

__all__ = ["DEFAULT_PROMPTS", "ExperimentError", "bundled_model", "check_device", "run_experiment", "write_first_ops"]
