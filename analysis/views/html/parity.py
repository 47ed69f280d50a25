"""The parity report's fragments: the answer, the verdict cards, each run's and witness set's detail, and the provenance,
each rendered as escaped HTML with jinja2 (the notebook only displays them). V3's gate is
:mod:`analysis.views.html.admission`, the runs and engines side by side :mod:`analysis.views.html.engines`."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping
from html import escape
from pathlib import Path
from typing import Any

from ...core import MISSING, cell, pairs
from ...studies import RATIO_WORDS
from ...verdicts import V3Policy
from ..plots.witness import differing_env_knobs
from .admission import _short
from .attribution import attribution_html
from .blocks import render
from .first_ops import first_op_html
from .review import run_review
from .run_provenance import run_html
from .run_tables import run_tables_html
from .tables import markers_html, table_html, witness_bands_html
from .witness_review import witness_reviews


def provenance_html(
    parameters: Mapping[str, Any], ws, policy: V3Policy, runs: Iterable[Any] = (), *, default: bool = False
) -> str:
    """The parameters as they took effect (the sources and runs read, the policy in force), and the provenance of every
    file and run: its kind, version, host, server commit and sha256, with any README beside the data.

    Parameters
    ----------
    parameters : mapping
        The report's parameters as given (``sources``, ``runs``, ``epsilon``, ``reference``, ``policy`` overrides,
        ``admission``).
    ws : WitnessSet
        The witness set.
    policy : V3Policy
        The policy in force.
    runs : iterable of Run, default ()
        The runs read.
    default : bool, default False
        The report was made with its default inputs.

    Returns
    -------
    str
        HTML.
    """
    files = _witness_files(ws)
    for run in runs:
        identity = run.manifest.get("identity", {}) or {}
        manifest = (run.path / "manifest.json").read_bytes() if run.path else b""
        files.append(
            {
                "source": run.label,
                "kind": "run",
                "version": cell(run.manifest.get("run_version", 1)),
                "host": cell(identity.get("host")),
                "commit": _short(identity.get("commit")),
                "sha256": hashlib.sha256(manifest).hexdigest()[:16] + " (manifest)",
            }
        )
    overrides = [(k, cell(v)) for k, v in (parameters.get("policy") or {}).items()]
    return render(
        "provenance.html.j2",
        sources=list(parameters.get("sources") or []),
        runs=[str(r) for r in parameters.get("runs") or []],
        default=default,
        epsilon=cell(parameters.get("epsilon")),
        reference=cell(parameters.get("reference")),
        overrides=overrides,
        policy=pairs(dataclasses.asdict(policy)),
        admission=cell(bool(parameters.get("admission"))),
        files=files,
        readmes=_readmes(ws.sources),
    )


def _witness_files(ws) -> list[dict[str, str]]:
    polars_set = ws.to_backend("polars")
    files = [
        {
            "source": row["source"],
            "kind": "witness",
            "version": cell(row["witness_version"]),
            "host": cell(row["host"]),
            "commit": _short(row["commit"]),
        }
        for row in polars_set.witnesses.iter_rows(named=True)
    ]
    files += [
        {
            "source": row["source"],
            "kind": "release marker",
            "version": MISSING,
            "host": cell(row["host"]),
            "commit": _short(row["commit"]),
        }
        for row in polars_set.markers.iter_rows(named=True)
    ]
    for row in files:
        row["sha256"] = hashlib.sha256(ws.texts[row["source"]].encode("utf-8")).hexdigest()[:16]
    return files


def _readmes(sources: Iterable[str]) -> list[dict[str, str]]:
    """Provenance READMEs that sit beside local sources, each shown once."""
    seen, out = set(), []
    for source in sources:
        if "://" in source:
            continue
        readme = Path(source).parent / "README.md"
        if readme.exists() and readme not in seen:
            seen.add(readme)
            out.append({"path": str(readme), "text": readme.read_text(encoding="utf-8")})
    return out


def judge_report(ws, runs: Iterable[Any] = ()) -> Any:
    """The report's one judgement: every run's rows (:func:`analysis.judge`, at ``bia certify``'s default 1% target), then every
    witness's. The answer table, the verdict cards and the sections side by side all render these rows.

    Parameters
    ----------
    ws : WitnessSet
        The witness set; judged when it holds any source.
    runs : iterable of Run, default ()
        The runs.

    Returns
    -------
    Judgement
    """
    from ...studies import judge

    return judge([*runs, *([ws] if ws.sources else [])])


def answer_section_html(judgement: Any) -> str:
    """The answer the report opens with: one row per run and arm (and witness), verdict, cause, cost, evidence and next step.

    Parameters
    ----------
    judgement : Judgement
        What :func:`analysis.judge` gave.

    Returns
    -------
    str
        HTML.

    Examples
    --------
    >>> from analysis import judge
    >>> html = answer_section_html(judge("data/experiment-cpu/default"))
    >>> '<table id="answer"' in html, 'data-verdict="RED"' in html
    (True, True)
    """
    from .answer import answer_html

    if not len(judgement):
        return '<p class="bia-fail">Nothing to judge: no run and no witness was read.</p>'
    verdicts = judgement.frame["verdict"].value_counts(sort=True)
    counted = ", ".join(f"{n} {v}" for v, n in verdicts.iter_rows())
    return (
        f"<h2>The answer</h2><p>Does a request batched with others (c &gt; 1) give the bits it gives alone (m=1)? {counted}. "
        "A server that differs from itself alone is RED (run-to-run) before batching is judged; GREEN needs every c complete and "
        "formed and the 95% bound on the divergence rate below 1%. Hover a row for its full reason.</p>"
        + answer_html(judgement)
        + f"<p>{escape(RATIO_WORDS)} Hover a ratio for its baseline.</p>"  # below the table: the answer stays first
        + _arms_note(judgement.frame["arm"].unique(maintain_order=True).to_list())
    )


def _arms_note(arms: list[str]) -> str:
    """Below the answer, what each arm its rows name sent: a run without arms is one arm named after its layout ("copies").

    Examples
    --------
    >>> _arms_note(["copies", "witness"])
    '<p class="bia-muted bia-arms">The arm in brackets is what was sent (a run without control arms is one arm, named after its layout): copies, every slot a copy of the prompt.</p>'
    """
    from ...run import ARM_WORDS

    said = [f"{arm}, {ARM_WORDS[arm]}" for arm in arms if arm in ARM_WORDS]
    if not said:
        return ""
    return (
        '<p class="bia-muted bia-arms">The arm in brackets is what was sent (a run without control arms is one arm, named after '
        f"its layout): {escape('; '.join(said))}.</p>"
    )


def reviews_html(
    ws, runs: Iterable[Any] = (), *, epsilon: float, reference: Any = "ref1", judgement: Any = None
) -> str:
    """The verdict cards: one per run and per witness, in the study's engine-neutral words.

    Parameters
    ----------
    ws : WitnessSet
        The witnesses read (none is fine).
    runs : iterable of Run
        The runs read.
    epsilon : float
        The near-tie epsilon: a margin below it explains a divergence.
    reference : str or Run
        What batched requests are compared with ("ref1", "ref2", or another run's ref #1).
    judgement : Judgement, optional
        :func:`judge_report`'s judgement of the same runs and witnesses (judged here when not given).

    Returns
    -------
    str
        Escaped HTML: a heading and one card per run, then per witness (see ``analysis.views.html.review``); each card's headline
        is its judgement's verdict and reason, the rest collapsed. Then, for runs probed with control arms, why their
        streams part (``analysis.views.html.attribution``).
    """
    runs = list(runs)
    judgement = judge_report(ws, runs) if judgement is None else judgement
    reviews = [run_review(run, epsilon=epsilon, reference=reference, judgement=judgement) for run in runs]
    witnesses = witness_reviews(ws, epsilon=epsilon, judgement=judgement) if ws.sources else []
    if not reviews and not witnesses:
        return '<p class="bia-fail">Nothing to judge: no run and no witness was read.</p>'
    return render("review.html.j2", runs=reviews, witnesses=witnesses, epsilon=cell(epsilon)) + attribution_html(runs)


def bands_html(ws) -> str:
    """The bands of every witness: shape served, agreement with m=1, rate, recorded and derived result.

    Parameters
    ----------
    ws : WitnessSet
        The witness set.

    Returns
    -------
    str
        HTML.
    """
    return witness_bands_html(ws)


def witness_details_html(ws) -> str:
    """A witness set's detail, collapsed: its bands, the env knobs that differ, and the release markers.

    Parameters
    ----------
    ws : WitnessSet
        The witness set.

    Returns
    -------
    str
        HTML.
    """
    knobs = differing_env_knobs(ws.to_backend("polars").witnesses)
    knobs = knobs.rename({c: c.removeprefix("env_") for c in knobs.columns if c.startswith("env_")})
    body = (
        bands_html(ws)
        + table_html(
            knobs,
            caption="Environment knobs that differ between the witnesses.",
            empty="No env knob differs between the witnesses.",
        )
        + markers_html(ws)
    )
    return _collapsed(f"Witness detail: bands, env knobs and release markers of {_count(ws)}", body)


def _count(ws) -> str:
    n = ws.to_backend("polars").witnesses.height
    return f"{n} witness{'es' if n != 1 else ''}"


def run_details_html(run, *, epsilon: float, reference: Any = "ref1") -> str:
    """A run's detail, collapsed: provenance, settings, what it lacks, negative control, forks, and its
    prompt, band and request tables cut to their worst rows; before it, for an experiment run replayed with taps,
    where its drift from m=1 starts.

    Parameters
    ----------
    run : Run
        The run.
    epsilon : float
        The near-tie epsilon.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with.

    Returns
    -------
    str
        HTML.
    """
    return first_op_html(run) + _collapsed(
        f"Run detail: {run.label}", run_html(run) + run_tables_html(run, epsilon=epsilon, reference=reference)
    )


def _collapsed(summary: str, body: str) -> str:
    return render("details.html.j2", summary=summary, body=body)
