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

# Import order follows the layers, lowest first (see pyproject's import-linter contracts).
from .core import WitnessError
from .core import OutputExists
from .core import __version__
from .io import default_rl_pairs, default_runs, default_sources
from .io import SourceError, expand_sources, fetch_url
from .dumps import Dump, DumpError, read_dump, read_dumps, scan_dump
from .metrics import SamplingMaskError, divergence_bound, mismatch_summary, mismatch_table, requests_needed
from .verdicts import REGRESSION_RULES, Rule
from .verdicts import PolicyError, ShapeVerdict, V3Policy, shape_check, shape_check_data, shape_check_text
from .verdicts import derive_band_result, derive_run_verdict
from .witness import WitnessSet, read_witness, read_witnesses
from .run import (
    Run,
    RunError,
    accuracy_table,
    assemble_run,
    band_forks,
    band_table,
    drift_table,
    first_op_table,
    flip_table,
    observer_table,
    prompt_table,
    read_mlperf_pair,
    read_run,
    reference_margins,
    slot_table,
    to_witness,
    width_table,
    write_run,
    write_witness,
)
from .studies import (
    RESULT_SETTINGS,
    History,
    HistoryError,
    Judgement,
    Study,
    append_history,
    attribution_shares,
    attribution_table,
    certificate,
    engine_table,
    judge,
    largest_k3,
    mismatch_summaries,
    mismatch_tokens,
    mode_comparison,
    read_history,
    scan_study,
    study_tables,
    trainer_pairs,
    write_dataset,
)
from .views.plots import (
    plot_band_widths,
    plot_decode_rate,
    plot_delta_before_fork,
    plot_divergence,
    plot_env_knobs,
    plot_flip_curve,
    plot_fork_tree,
    plot_margin_at_divergence,
    plot_margin_trace,
    plot_run_decode_rate,
    plot_run_divergence,
    plot_unique_completions,
)
from .views.plots import plot_trend
from .report import render_report
from .report.trend import render_trend
from .experiment import ExperimentError, run_experiment
from .probe import (
    CallableError,
    ProbeError,
    ProbeSettings,
    probe_callable,
)  # the probe itself stays analysis.probe.probe: a function of that name would hide the package
from .reproduce import Repro, ReproError, repro
from . import (
    dumps as dumps,
    parity as parity,
    plots as plots,
    report as report,
    run as run,
    trend as trend,
)  # bound by name
from . import views as views  # the public modules, bound by name

# The flow a notebook walks, in one namespace: read -> tables -> plots -> report.
__all__ = [
    "CallableError",
    "Dump",
    "DumpError",
    "ExperimentError",
    "History",
    "HistoryError",
    "Judgement",
    "OutputExists",
    "PolicyError",
    "ProbeError",
    "ProbeSettings",
    "REGRESSION_RULES",
    "RESULT_SETTINGS",
    "Repro",
    "ReproError",
    "Rule",
    "Run",
    "RunError",
    "SamplingMaskError",
    "ShapeVerdict",
    "SourceError",
    "Study",
    "V3Policy",
    "WitnessError",
    "WitnessSet",
    "__version__",
    "accuracy_table",
    "append_history",
    "assemble_run",
    "attribution_shares",
    "attribution_table",
    "band_forks",
    "band_table",
    "certificate",
    "default_rl_pairs",
    "default_runs",
    "default_sources",
    "derive_band_result",
    "derive_run_verdict",
    "divergence_bound",
    "drift_table",
    "engine_table",
    "expand_sources",
    "fetch_url",
    "first_op_table",
    "flip_table",
    "judge",
    "largest_k3",
    "mismatch_summaries",
    "mismatch_summary",
    "mismatch_table",
    "mismatch_tokens",
    "mode_comparison",
    "observer_table",
    "plot_band_widths",
    "plot_decode_rate",
    "plot_delta_before_fork",
    "plot_divergence",
    "plot_env_knobs",
    "plot_flip_curve",
    "plot_fork_tree",
    "plot_margin_at_divergence",
    "plot_margin_trace",
    "plot_run_decode_rate",
    "plot_run_divergence",
    "plot_trend",
    "plot_unique_completions",
    "probe_callable",
    "prompt_table",
    "read_dump",
    "read_dumps",
    "read_history",
    "read_mlperf_pair",
    "read_run",
    "read_witness",
    "read_witnesses",
    "reference_margins",
    "render_report",
    "render_trend",
    "repro",
    "requests_needed",
    "run_experiment",
    "scan_dump",
    "scan_study",
    "shape_check",
    "shape_check_data",
    "shape_check_text",
    "slot_table",
    "study_tables",
    "to_witness",
    "trainer_pairs",
    "width_table",
    "write_dataset",
    "write_run",
    "write_witness",
]

# Every card Jupyter shows is drawn in analysis.views, which sits above the objects' floors (a run's card opens with its
# verdict, computed above the run): no object defines its own, so the face gives each its card.
_CARDS = {
    Run: views.run_card,
    Judgement: views.html.judgement_html,
    WitnessSet: views.witness_card,
    Dump: views.dump_card,
    History: views.history_card,
    ShapeVerdict: views.shape_verdict_card,
    Study: views.study_card,
}
for _cls, _card in _CARDS.items():
    _cls._repr_html_ = _card  # type: ignore[attr-defined]

# Public classes say they belong to the package face, as httpx's do: reprs, tracebacks and pickles name
# ``analysis.Run`` rather than the private module that happens to define it today.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith("analysis."):
        _obj.__module__ = __name__
del _name, _obj, _cls, _card
