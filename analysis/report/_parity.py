"""The parity report: a parameterised notebook executed by papermill and exported as one
self-contained HTML file (no code, no network request).

The notebook stays thin: it displays the report's sections (``_sections``: ``answer``, ``runs``, ``figures``, ...), which
draw with :mod:`analysis.views`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..core import claim_output
from ..io import bundled
from ..studies import is_study
from ..verdicts import V3Policy
from ._notebook import DEFAULT_TITLE, ReportError, _once, execute_to_html


def notebook_path() -> Path:
    """The parity report notebook (``notebooks/parity_report.ipynb``)."""
    return bundled("notebooks/parity_report.ipynb")


def render_report(
    sources: Iterable[str | os.PathLike[str]] | None = None,
    output: str | os.PathLike[str] = "parity-report.html",
    *,
    runs: Iterable[str | os.PathLike[str]] | None = None,
    epsilon: float = 0.05,
    reference: str | os.PathLike[str] = "ref1",
    title: str = DEFAULT_TITLE,
    policy: Mapping[str, Any] | V3Policy | None = None,
    admission: bool | None = None,
    executed_notebook: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
    timeout_s: int = 600,
    force: bool = False,
) -> Path:
    """Execute the parity report notebook with papermill and export it as one HTML file.

    Parameters
    ----------
    sources : iterable of paths or URLs, optional
        Witness and marker sources; the embedded default data when both these and ``runs`` are empty.
    runs : iterable of paths, optional
        Run directories (see :mod:`analysis.run`).
    epsilon : float
        The near-tie epsilon for the runs' margins.
    reference : str or path
        What each batched request is compared with: "ref1", "ref2", or another run directory (its ref #1).
    output : path
        Where the HTML goes.
    title : str
        The report's title.
    policy : mapping or V3Policy, optional
        Overrides of the V3 policy's constants.
    admission : bool, optional
        Also judge every run by aprender's V3 release gate, in its own section (witnesses always
        are); by default only when ``policy`` is given.
    executed_notebook : path, optional
        Also keep the executed notebook here (it holds no progress widgets).
    progress : bool, optional
        Show papermill's cell progress bar; by default only in a terminal.
    timeout_s : int
        Per-cell time limit.
    force : bool
        Overwrite ``output`` and ``executed_notebook`` when they exist (refused otherwise, before
        the notebook runs).

    Returns
    -------
    Path
        The HTML file written.
    """
    if isinstance(policy, V3Policy):
        policy = dataclasses.asdict(policy)
    sources, runs = _once(sources or [], "source"), _once(runs or [], "run")
    parameters: dict[str, Any] = {
        "sources": sources,
        "runs": runs,
        "epsilon": float(epsilon),
        "reference": os.fspath(reference),
        "title": title,
        "policy": {k: list(v) if isinstance(v, tuple) else v for k, v in dict(policy or {}).items()},
        "admission": bool(admission) if admission is not None else policy is not None,
    }
    V3Policy.from_mapping(parameters["policy"])  # refuse a bad policy before starting a kernel
    for run in parameters["runs"]:
        if not (Path(run) / "manifest.json").exists() and not is_study(run):
            raise ReportError(f"{run}: neither a run directory (no manifest.json) nor a study (no runs.parquet)")
    output = claim_output(output, force=force, what="the report")
    if executed_notebook:
        claim_output(executed_notebook, force=force, what="the executed notebook")
    show = progress if progress is not None else sys.stderr.isatty()
    return execute_to_html(
        notebook_path(),
        parameters,
        output,
        what="report",
        executed_notebook=executed_notebook,
        progress=show,
        timeout_s=timeout_s,
    )
