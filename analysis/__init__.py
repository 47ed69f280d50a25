"""bia: batch-invariance studies of LLM inference.

Read parity witnesses into tidy frames, judge them with aprender's V3 serving-shape check,
and render a self-contained parity report.

Examples
--------
>>> import analysis
>>> ws = analysis.read_witnesses("data/aprender-lambda")
>>> ws.witnesses.height, ws.bands.height, ws.markers.height
(3, 12, 2)
>>> analysis.shape_check("data/aprender-lambda/witness@464c168e62.json").exit_code
5
"""

from ._fields import WitnessError
from ._sources import SourceError, expand_sources, fetch_url
from ._v3 import PolicyError, ShapeVerdict, V3Policy, shape_check, shape_check_data, shape_check_text
from .dumps import Dump, DumpError, read_dump, read_dumps, scan_dump
from ._witness import WitnessSet, derive_band_result, derive_run_verdict, read_witness, read_witnesses
from .report import default_sources, render_report
from ._study import Study, scan_study, study_tables, write_dataset

__version__ = "0.1.0"

__all__ = [
    "Dump",
    "DumpError",
    "PolicyError",
    "ShapeVerdict",
    "SourceError",
    "Study",
    "V3Policy",
    "WitnessError",
    "WitnessSet",
    "__version__",
    "default_sources",
    "derive_band_result",
    "derive_run_verdict",
    "expand_sources",
    "fetch_url",
    "read_dump",
    "read_dumps",
    "read_witness",
    "read_witnesses",
    "render_report",
    "scan_dump",
    "scan_study",
    "shape_check",
    "shape_check_data",
    "shape_check_text",
    "study_tables",
    "write_dataset",
]
