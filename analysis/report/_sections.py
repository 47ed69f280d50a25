"""The parity report's sections, each one call in any notebook: the header, the answer, the runs, the figures, the detail,
aprender's V3 gate, the sampler-trainer mismatch and the provenance.

Each takes runs (:class:`analysis.Run` objects, or run directories to read) and/or witnesses (a
:class:`analysis.WitnessSet`, or sources to read) and returns a :class:`Section`, which Jupyter displays as the report
shows it. The report notebook (``notebooks/parity_report.py``) is these calls in order; the HTML itself is drawn in
``analysis.views`` (the fragments below these sections are its, not this package's surface). The verdicts come from
one judgement: pass the report's (``judgement=``) or each section judges what it was given with :func:`analysis.judge`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..core import trim_heap
from ..run import Run, read_run
from ..studies import Judgement, open_runs
from ..verdicts import V3Policy
from ..views.html import (
    Section,
    admission_html,
    answer_section_html,
    engines_html,
    figures_html,
    header_html,
    judge_report,
    mode_comparison_html,
    provenance_html,
    reviews_html,
    rl_mismatch_html,
    run_details_html,
    witness_details_html,
)
from ..views.plots import rl_mismatch_figures, run_figures, witness_figures
from ..witness import WitnessSet, read_witnesses

RunsLike = Run | str | os.PathLike[str] | Iterable[Run | str | os.PathLike[str]] | None
WitnessesLike = WitnessSet | str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None


def _runs(runs: RunsLike) -> list[Run]:
    """Runs as given: one Run, run directory or study, or several; a directory or a study is opened a piece at a time
    (:func:`analysis.studies.open_runs`), as the report reads it."""
    if runs is None:
        return []
    if isinstance(runs, Run | str | os.PathLike):
        runs = [runs]
    return [opened for run in runs for opened in ([run] if isinstance(run, Run) else open_runs([run]))]


def _witnesses(witnesses: WitnessesLike) -> WitnessSet:
    """A witness set as given, or read (quietly) from its sources; none is the empty set."""
    if isinstance(witnesses, WitnessSet):
        return witnesses
    if isinstance(witnesses, str | os.PathLike):
        witnesses = [witnesses]
    return read_witnesses(list(witnesses or []), progress=False)


def _reference(reference: str | os.PathLike[str] | Run) -> str | Run:
    """``"ref1"``, ``"ref2"``, or another run (read when given as its directory) whose ref #1 every request is compared with."""
    if isinstance(reference, Run) or reference in ("ref1", "ref2"):
        return reference
    return read_run(reference)


def _judged(judgement: Judgement | None, ws: WitnessSet, runs: list[Run]) -> Judgement:
    return judge_report(ws, runs) if judgement is None else judgement


def header(
    title: str,
    runs: RunsLike = None,
    witnesses: WitnessesLike = None,
    *,
    default: bool = False,
    admission: bool = False,
) -> Section:
    """The report's title block: when and by what it was made, and what it read.

    Parameters
    ----------
    title : str
        The title (escaped).
    runs : Run, path or iterable of them, optional
        The runs read.
    witnesses : WitnessSet, path or iterable of paths, optional
        The witnesses read.
    default : bool, default False
        The report read the embedded default data.
    admission : bool, default False
        The report has aprender's V3 gate.

    Returns
    -------
    Section

    Examples
    --------
    >>> from analysis import report
    >>> "1 run" in report.header("My runs", "data/experiment-cpu/default")._repr_html_()
    True
    """
    return Section(
        "header", header_html(title, _witnesses(witnesses), _runs(runs), default=default, admission=admission)
    )


def answer(runs: RunsLike = None, witnesses: WitnessesLike = None, *, judgement: Judgement | None = None) -> Section:
    """The answer the report opens with: per run and arm (and witness) bia's verdict, its cause, cost, evidence and next step.

    Parameters
    ----------
    runs : Run, path or iterable of them, optional
        The runs to answer for.
    witnesses : WitnessSet, path or iterable of paths, optional
        The witnesses to answer for.
    judgement : Judgement, optional
        Their judgement (:func:`analysis.judge`), when already made; judged here when not given.

    Returns
    -------
    Section
        A heading, the answer table (one row per judgement row) and what its arms sent.

    Examples
    --------
    >>> from analysis import read_run, report
    >>> section = report.answer(read_run("data/experiment-cpu/default"))
    >>> '<table id="answer"' in section._repr_html_(), 'data-verdict="RED"' in section._repr_html_()
    (True, True)
    """
    runs_, ws = _runs(runs), _witnesses(witnesses)
    return Section("answer", answer_section_html(_judged(judgement, ws, runs_)))


def runs(
    runs: RunsLike = None,
    witnesses: WitnessesLike = None,
    *,
    epsilon: float = 0.05,
    reference: str | os.PathLike[str] | Run = "ref1",
    judgement: Judgement | None = None,
) -> Section:
    """The verdict cards, one per run and per witness, then, for several runs, the runs and engines side by side.

    Parameters
    ----------
    runs : Run, path or iterable of them, optional
        The runs.
    witnesses : WitnessSet, path or iterable of paths, optional
        The witnesses.
    epsilon : float, default 0.05
        The near-tie epsilon: a top-1/top-2 margin below it explains a divergence.
    reference : {"ref1", "ref2"}, path or Run, default "ref1"
        What batched requests are compared with: a run's own m=1 references, or another run's ref #1.
    judgement : Judgement, optional
        The judgement of the same runs and witnesses; judged here when not given. Each card's headline is its row.

    Returns
    -------
    Section

    Examples
    --------
    >>> from analysis import report
    >>> html = report.runs("data/experiment-cpu/default")._repr_html_()
    >>> html.count('<article class="bia-card bia-review'), "Runs side by side" in html
    (1, False)
    """
    runs_, ws = _runs(runs), _witnesses(witnesses)
    judgement = _judged(judgement, ws, runs_)
    against = _reference(reference)
    parts = [reviews_html(ws, runs_, epsilon=epsilon, reference=against, judgement=judgement)]
    if len(runs_) > 1:
        parts.append(
            "<h2>Runs side by side</h2><p>Per run and batch size: the share of requests whose float32 logprobs are "
            "bit-identical to the reference, token flips, the run's verdict and its largest ULP distance from m=1, the median "
            "per-request decode rate, its ratio to the c=1 baseline (the answer's) and that rate over the default mode's in "
            "the same folder: the parity a kernel mode buys and what it costs.</p>"
        )
        parts.append(mode_comparison_html(runs_, reference=against, judgement=judgement))
    engines = engines_html(runs_, judgement=judgement)
    if engines:
        parts.append(
            "<h2>Engines side by side</h2><p>One model served by several engines: where each engine's streams part from the "
            "reference engine's m=1 stream of the same prompt, and each run's verdict against its own m=1 (the answer "
            "above).</p>"
        )
        parts.append(engines)
    return Section("runs", "".join(parts))


def figures(
    runs: RunsLike = None,
    witnesses: WitnessesLike = None,
    *,
    epsilon: float = 0.05,
    reference: str | os.PathLike[str] | Run = "ref1",
    judgement: Judgement | None = None,
) -> Section:
    """Each run's and the witnesses' figures, collapsed: where requests part, the margins there, the widths formed and the
    decode rates.

    Parameters
    ----------
    runs : Run, path or iterable of them, optional
        The runs.
    witnesses : WitnessSet, path or iterable of paths, optional
        The witnesses.
    epsilon : float, default 0.05
        The near-tie epsilon drawn on the margin plots.
    reference : {"ref1", "ref2"}, path or Run, default "ref1"
        What batched requests are compared with.
    judgement : Judgement, optional
        The judgement of the same runs, whose rows the divergence figures restate; each run judged here when not given
        (and the reference is ref #1).

    Returns
    -------
    Section
        A heading, then one collapsed block of PNG figures (with their alt text) for the witnesses and one per run.

    Examples
    --------
    >>> from analysis import report
    >>> html = report.figures("data/experiment-cpu/default")._repr_html_()
    >>> html.count('<details class="bia-figures"'), html.count('src="data:image/png;base64,') > 0
    (1, True)
    """
    runs_, ws, against = _runs(runs), _witnesses(witnesses), _reference(reference)
    parts = [
        "<h2>Figures</h2><p>Each run's and the witnesses' figures, collapsed: open one to see where its requests part, the "
        "margins there, the widths formed and the decode rates.</p>"
    ]
    if ws.sources:
        parts.append(
            figures_html(
                witness_figures(ws), "Witnesses: divergence and decode rate against c, and the env knobs that differ"
            )
        )
    judged = judgement if isinstance(against, str) and against == "ref1" else None  # it compares with ref #1
    parts += [
        figures_html(run_figures(run, epsilon=epsilon, reference=against, judgement=judged), f"Run {run.label}")
        for run in runs_
    ]
    # matplotlib's and numpy's arrays live on the C heap, whose freed pages glibc keeps: handed back here, what the
    # figures drew is not held through the rest of the report (54 MB at 516,000 requests, 16 MB at 129,000)
    trim_heap()
    return Section("figures", "".join(parts))


def detail(
    runs: RunsLike = None,
    witnesses: WitnessesLike = None,
    *,
    epsilon: float = 0.05,
    reference: str | os.PathLike[str] | Run = "ref1",
) -> Section:
    """Each run's provenance, negative control, forks and per-prompt tables, and each witness set's bands and markers,
    collapsed; long tables show their worst rows and count the rest.

    Parameters
    ----------
    runs : Run, path or iterable of them, optional
        The runs.
    witnesses : WitnessSet, path or iterable of paths, optional
        The witnesses.
    epsilon : float, default 0.05
        The near-tie epsilon.
    reference : {"ref1", "ref2"}, path or Run, default "ref1"
        What each request is compared with.

    Returns
    -------
    Section

    Examples
    --------
    >>> from analysis import report
    >>> "Run detail: " in report.detail("data/experiment-cpu/default")._repr_html_()
    True
    """
    runs_, ws, against = _runs(runs), _witnesses(witnesses), _reference(reference)
    parts = [
        "<h2>Detail</h2><p>Each run's provenance, negative control, forks and per-prompt tables, and each witness set's "
        "bands and markers; long tables show their worst rows and count the rest.</p>"
    ]
    parts += [run_details_html(run, epsilon=epsilon, reference=against) for run in runs_]
    if ws.sources:
        parts.append(witness_details_html(ws))
    return Section("detail", "".join(parts))


def _policy(policy: Mapping[str, Any] | V3Policy | None) -> V3Policy:
    return policy if isinstance(policy, V3Policy) else V3Policy.from_mapping(dict(policy or {}))


def gate(
    runs: RunsLike = None,
    witnesses: WitnessesLike = None,
    *,
    policy: Mapping[str, Any] | V3Policy | None = None,
    judgement: Judgement | None = None,
) -> Section:
    """aprender's V3 release gate (its admission): every witness's recorded, re-derived and V3 verdict, with bia's beside a
    recorded one it does not share, and each run judged by the gate one witness per prompt.

    Parameters
    ----------
    runs : Run, path or iterable of them, optional
        The runs to judge by the gate (the report passes them only when asked to, with ``admission``).
    witnesses : WitnessSet, path or iterable of paths, optional
        The witnesses, each judged by the gate.
    policy : mapping or V3Policy, optional
        The policy in force, or overrides of its constants (``{"model_prefix": "llama-3.1-8b"}``); aprender's by default.
    judgement : Judgement, optional
        bia's judgement of the witnesses (the report's); judged here when not given.

    Returns
    -------
    Section

    Examples
    --------
    >>> from analysis import report
    >>> html = report.gate(witnesses="data/aprender-lambda")._repr_html_()
    >>> "V3" in html and "witness@464c168e62.json" in html
    True
    """
    runs_, ws, in_force = _runs(runs), _witnesses(witnesses), _policy(policy)
    return Section("gate", admission_html(ws, ws.shape_checks(in_force), runs_, in_force, judgement))


def mismatch(pairs: Sequence[str | os.PathLike[str]]) -> Section:
    """The sampler-trainer mismatch: every RL framework's metrics per pair, and the figures of the per-token ``delta``.

    Parameters
    ----------
    pairs : sequence of str or path
        Sampler-trainer pairs files (prime-rl token exports), as ``bia experiment --trainer`` writes them
        (:func:`analysis.trainer_pairs` finds them beside run directories).

    Returns
    -------
    Section
        Empty when no pair is given.

    Examples
    --------
    >>> import analysis
    >>> from analysis import report
    >>> "verl" in report.mismatch(analysis.trainer_pairs(["data/experiment-cpu/default"]))._repr_html_()
    True
    """
    pairs = list(pairs)
    if not pairs:
        return Section("mismatch", "")
    return Section(
        "mismatch",
        rl_mismatch_html(pairs) + figures_html(rl_mismatch_figures(pairs), "Sampler-trainer mismatch figures"),
    )


def provenance(
    runs: RunsLike = None,
    witnesses: WitnessesLike = None,
    *,
    parameters: Mapping[str, Any] | None = None,
    policy: Mapping[str, Any] | V3Policy | None = None,
    default: bool = False,
) -> Section:
    """The parameters as they took effect and the provenance of every file and run read: kind, version, host, server
    commit and sha256, with any README beside the data.

    Parameters
    ----------
    runs : Run, path or iterable of them, optional
        The runs read.
    witnesses : WitnessSet, path or iterable of paths, optional
        The witnesses read.
    parameters : mapping, optional
        The report's parameters as given (``sources``, ``runs``, ``epsilon``, ``reference``, ``policy`` overrides,
        ``admission``); by default the sources and runs read, at the report's defaults.
    policy : mapping or V3Policy, optional
        The V3 policy in force, or overrides of its constants.
    default : bool, default False
        The report read the embedded default data.

    Returns
    -------
    Section

    Examples
    --------
    >>> from analysis import report
    >>> "manifest" in report.provenance("data/experiment-cpu/default")._repr_html_()
    True
    """
    runs_, ws, in_force = _runs(runs), _witnesses(witnesses), _policy(policy)
    if parameters is None:
        overrides = {} if policy is None or isinstance(policy, V3Policy) else dict(policy)
        parameters = {
            "sources": ws.sources,
            "runs": [run.label for run in runs_],
            "epsilon": 0.05,
            "reference": "ref1",
            "policy": overrides,
            "admission": False,
        }
    return Section("provenance", provenance_html(parameters, ws, in_force, runs_, default=default))
