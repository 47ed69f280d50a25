"""The parity report: a parameterised notebook executed by papermill and exported as one
self-contained HTML file (no code, no network request).

The notebook stays thin: it calls the ``*_html`` functions here, which render escaped HTML
fragments with jinja2, and the ``plot_*`` functions of :mod:`analysis.plots`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from html import escape
from pathlib import Path
from typing import Any

import polars as pl

from ._details import markers_html, negative_control, run_html, run_tables_html, table_html
from ._html import render
from ._output import claim_output
from ._show import MISSING, cell, pairs, percent
from ._v3 import ShapeVerdict, V3Policy

__all__ = ["ReportError", "admission_html", "bands_html", "default_runs", "default_sources", "execute_to_html", "export_html", "header_html", "heading_html", "markers_html",
           "mode_comparison", "mode_comparison_html", "negative_control", "notebook_path", "provenance_html", "render_report", "reviews_html",
           "run_details_html", "run_figures", "run_html", "run_tables_html", "show_figure", "table_html", "verdicts_html", "witness_details_html",
           "witness_figures"]

_HERE = Path(__file__).resolve().parent
DEFAULT_TITLE = "Batch-parity report"


class ReportError(RuntimeError):
    """The report notebook failed; the message carries the notebook's own error."""


def _bundled(relative: str) -> Path:
    """A file shipped with bia: inside the installed package, else in the source checkout."""
    for base in (_HERE / "_bundled", _HERE.parent):
        candidate = base / relative
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"bia's bundled {relative} is missing from {_HERE}")


def notebook_path() -> Path:
    """The parity report notebook (``notebooks/parity_report.ipynb``)."""
    return _bundled("notebooks/parity_report.ipynb")


def default_sources() -> list[str]:
    """The embedded default data: the real perf041 witnesses and markers from host "lambda".

    Examples
    --------
    >>> default_sources()
    ['data/aprender-lambda']
    """
    return [_shown(_bundled("data/aprender-lambda"))]


def _shown(path: Path) -> str:
    """A bundled path as a reader would type it: relative to the working folder when it lies inside it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)
    return str(path) if relative.startswith("..") else relative


def default_runs() -> list[str]:
    """The embedded default runs: the torch experiment on CPU in its three kernel modes (``data/experiment-cpu``),
    then a real llama.cpp server on CPU with and without its prompt cache (``data/llamacpp-cpu``).

    Examples
    --------
    >>> [run.rsplit("/", 2)[-2:] for run in default_runs()]  # doctest: +NORMALIZE_WHITESPACE
    [['experiment-cpu', 'batch-invariant'], ['experiment-cpu', 'default'], ['experiment-cpu', 'fixed-tiles'],
     ['llamacpp-cpu', 'cache-prompt'], ['llamacpp-cpu', 'no-cache-prompt']]
    """
    return [_shown(p.parent) for folder in ("data/experiment-cpu", "data/llamacpp-cpu")
            for p in sorted(_bundled(folder).glob("*/manifest.json"))]


# --- HTML fragments the notebook displays --------------------------------------------------


def _short(commit: str | None) -> str:
    return commit[:10] if commit else MISSING


def header_html(title: str, ws, runs: Iterable[Any] = (), *, default: bool = False, admission: bool = False) -> str:
    """The title, when and by what the report was made, and what it read."""
    runs = list(runs)
    polars_set = ws.to_backend("polars")
    counts = [(len(runs), "run"), (polars_set.witnesses.height, "witness"), (polars_set.markers.height, "release marker")]
    read = ", ".join(f"{n} {what}{'es' if what == 'witness' and n != 1 else 's' if n != 1 else ''}" for n, what in counts if n) or "nothing"
    read += " (the embedded default)" if default else ""
    return render("header.html.j2", title=title, generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  version=_version(), read=read, admission=admission)


def provenance_html(parameters: Mapping[str, Any], ws, policy: V3Policy, runs: Iterable[Any] = (), *, default: bool = False) -> str:
    """The parameters as they took effect (the sources and runs read, the policy in force), and the provenance of every
    file and run: its kind, version, host, server commit and sha256, with any README beside the data."""
    files = _witness_files(ws)
    for run in runs:
        identity = run.manifest.get("identity", {}) or {}
        manifest = (run.path / "manifest.json").read_bytes() if run.path else b""
        files.append({"source": str(run.path), "kind": "run", "version": cell(run.manifest.get("run_version", 1)), "host": cell(identity.get("host")),
                      "commit": _short(identity.get("commit")), "sha256": hashlib.sha256(manifest).hexdigest()[:16] + " (manifest)"})
    overrides = [(k, cell(v)) for k, v in (parameters.get("policy") or {}).items()]
    return render("provenance.html.j2", sources=list(parameters.get("sources") or []), runs=[str(r) for r in parameters.get("runs") or []],
                  default=default, epsilon=cell(parameters.get("epsilon")), reference=cell(parameters.get("reference")), overrides=overrides,
                  policy=pairs(dataclasses.asdict(policy)), admission=cell(bool(parameters.get("admission"))), files=files,
                  readmes=_readmes(ws.sources))


def _witness_files(ws) -> list[dict[str, str]]:
    polars_set = ws.to_backend("polars")
    files = [{"source": row["source"], "kind": "witness", "version": cell(row["witness_version"]), "host": cell(row["host"]),
              "commit": _short(row["commit"])} for row in polars_set.witnesses.iter_rows(named=True)]
    files += [{"source": row["source"], "kind": "release marker", "version": MISSING, "host": cell(row["host"]), "commit": _short(row["commit"])}
              for row in polars_set.markers.iter_rows(named=True)]
    for row in files:
        row["sha256"] = hashlib.sha256(ws.texts[row["source"]].encode("utf-8")).hexdigest()[:16]
    return files


def _version() -> str:
    from . import __version__

    return __version__


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


def heading_html(words: str, name: str, level: int = 3) -> str:
    """A heading naming a run or a file: ``words`` then ``name`` as code, both escaped.

    Examples
    --------
    >>> heading_html("Run", "runs/<b>")
    '<h3>Run <code>runs/&lt;b&gt;</code></h3>'
    """
    return f"<h{level}>{escape(words)} <code>{escape(name)}</code></h{level}>"


def reviews_html(ws, runs: Iterable[Any] = (), *, epsilon: float, reference: Any = "ref1") -> str:
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

    Returns
    -------
    str
        Escaped HTML: a heading and one card per run, then per witness (see ``analysis._review``).
    """
    from ._review import run_review, witness_reviews

    runs = [run_review(run, epsilon=epsilon, reference=reference) for run in runs]
    witnesses = witness_reviews(ws, epsilon=epsilon) if ws.sources else []
    if not runs and not witnesses:
        return '<p class="bia-fail">Nothing to judge: no run and no witness was read.</p>'
    return render("review.html.j2", runs=runs, witnesses=witnesses, epsilon=cell(epsilon))


_LONG_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d{5,}(?:[eE][-+]?\d+)?(?![\w.])")


def rounded(text: str) -> str:
    """A reason with its long decimals rounded for people; V3's own text keeps every digit.

    Examples
    --------
    >>> rounded("per-request decode at c=4 is 102.92960513109377 tok/s, 3.5% of c=1's 2940.1234567 tok/s")
    "per-request decode at c=4 is 102.9 tok/s, 3.5% of c=1's 2,940 tok/s"
    """
    return _LONG_DECIMAL.sub(lambda m: cell(float(m.group(0))), text)


def _for_people(verdict: ShapeVerdict) -> dict[str, Any]:
    """A V3 verdict as the report shows it: its status and exit code, the reasons' numbers rounded."""
    return {"status": verdict.status, "exit_code": verdict.exit_code, "source": verdict.source, "reasons": [rounded(r) for r in verdict.reasons]}


def verdicts_html(ws, verdicts: Mapping[str, ShapeVerdict]) -> str:
    """Each witness's recorded and re-derived run verdict, its V3 verdict, and every discrepancy."""
    polars_set = ws.to_backend("polars")
    witnesses = [{"source": row["source"], "version": cell(row["witness_version"]), "host": cell(row["host"]), "commit": _short(row["commit"]),
                  "model": cell(row["model_path"]), "recorded": row["recorded_verdict"], "derived": cell(row["derived_verdict"]),
                  "agrees": row["verdict_agrees"], "verdict": _for_people(verdicts[row["source"]])}
                 for row in polars_set.witnesses.iter_rows(named=True)]
    discrepancies = [{k: cell(v) for k, v in row.items()} for row in polars_set.discrepancies.iter_rows(named=True)]
    return render("verdicts.html.j2", witnesses=witnesses, discrepancies=discrepancies)


def admission_html(ws, verdicts: Mapping[str, ShapeVerdict], runs: Iterable[Any], policy: V3Policy) -> str:
    """aprender's V3 release gate as its own section.

    Parameters
    ----------
    ws : WitnessSet
        The witnesses, each with its recorded and re-derived verdict and its V3 verdict.
    verdicts : mapping of str to ShapeVerdict
        Each witness's V3 verdict by source.
    runs : iterable of Run
        The runs to judge too, one witness per prompt (empty unless the reader asked).
    policy : V3Policy
        The policy in force, described in the section's opening words.

    Returns
    -------
    str
        Escaped HTML; the reasons' long decimals rounded for people (see ``rounded``).
    """
    from ._details import run_admission

    judged = []
    for run in runs:
        groups = run_admission(run, policy)
        judged.append({"path": str(run.path), "groups": [_group(run, g) for g in groups]})
    return render("admission.html.j2", policy=policy, bands=cell(list(policy.bands)), ratio=f"{policy.s7_ratio:.0%}",
                  witnesses=verdicts_html(ws, verdicts) if ws.sources else "", runs=judged)


def _group(run, group: Mapping[str, Any]) -> dict[str, Any]:
    """Prompts with one V3 verdict, the verdict named after all of them."""
    names = _names(group["prompts"])
    verdict = {**_for_people(group["verdict"]), "source": f"{run.path or 'run'}, prompt{'s' if len(group['prompts']) > 1 else ''} {names}"}
    return {**group, "verdict": verdict, "names": names}


def _names(items: list[str], n: int = 8) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def bands_html(ws) -> str:
    """The bands of every witness: shape served, agreement with m=1, rate, recorded and derived result."""
    from ._details import witness_bands_html

    return witness_bands_html(ws)


def witness_details_html(ws) -> str:
    """A witness set's detail, collapsed: its bands, the env knobs that differ, and the release markers."""
    from ._details import markers_html
    from .plots import differing_env_knobs

    knobs = differing_env_knobs(ws.to_backend("polars").witnesses)
    knobs = knobs.rename({c: c.removeprefix("env_") for c in knobs.columns if c.startswith("env_")})
    body = (bands_html(ws) + table_html(knobs, caption="Environment knobs that differ between the witnesses.",
                                        empty="No env knob differs between the witnesses.") + markers_html(ws))
    return _collapsed(f"Witness detail: bands, env knobs and release markers of {_count(ws)}", body)


def _count(ws) -> str:
    n = ws.to_backend("polars").witnesses.height
    return f"{n} witness{'es' if n != 1 else ''}"


def run_details_html(run, *, epsilon: float, reference: Any = "ref1") -> str:
    """A run's detail, collapsed: provenance, settings, what it lacks, negative control, forks, and its
    prompt, band and request tables cut to their worst rows."""
    return _collapsed(f"Run detail: {run.path}", run_html(run) + run_tables_html(run, epsilon=epsilon, reference=reference))


def _collapsed(summary: str, body: str) -> str:
    return render("details.html.j2", summary=summary, body=body)


def show_figure(ax_or_figure, alt: str) -> None:
    """Display a figure as a PNG whose alt text describes it, then close it.

    Parameters
    ----------
    ax_or_figure : matplotlib Axes or Figure
        What to show; a panel the plot functions left empty (``ax.bia_empty``) is removed and its
        reason said in words below, and a figure with nothing left is not drawn at all.
    alt : str
        The image's alt text in the exported HTML, for screen readers and tests.
    """
    from io import BytesIO

    import matplotlib.pyplot as plt
    from IPython.display import HTML, Image, display

    figure = getattr(ax_or_figure, "figure", ax_or_figure)
    notes = [ax.bia_empty for ax in figure.axes if getattr(ax, "bia_empty", None)]
    for ax in [ax for ax in figure.axes if getattr(ax, "bia_empty", None)]:
        figure.delaxes(ax)
    if figure.axes:
        buffer = BytesIO()
        figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        display(Image(data=buffer.getvalue(), format="png", metadata={"alt": alt}))
    plt.close(figure)
    if notes:
        display(HTML(render("notes.html.j2", notes=notes)))


def witness_figures(ws) -> list[tuple[Any, str]]:
    """The witness set's figures with their alt text: divergence and decode rate against c, and the env knobs that differ."""
    import matplotlib.pyplot as plt

    from . import plots

    bands = ws.to_backend("polars").bands
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    plots.plot_divergence(bands, ax=axes[0])
    plots.plot_decode_rate(bands, ax=axes[1])
    out = [(fig, "divergence_at against batch size c for each witness, with declared_min marked; "
                 "per-request decode rate against c, with the 50%-of-c=1 line")]
    witnesses = ws.to_backend("polars").witnesses
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.5 * max(1, min(witnesses.height, 20))))
    plots.plot_env_knobs(witnesses, ax=ax)
    return [*out, (fig, "kernel env knobs that differ between witnesses")]


def run_figures(run, *, epsilon: float, reference: Any = "ref1") -> list[tuple[Any, str]]:
    """A run's four figures of two panels each, for :func:`show_figure`.

    Where requests parted and the margin there; the margin along each reference and the drift
    before the fork (one colour per c); P(flip | margin) and the widths formed; decode rate and
    unique completions against c.

    Parameters
    ----------
    run : Run
        The run.
    epsilon : float
        The near-tie epsilon drawn on the margin plots.
    reference : str or Run
        What batched requests are compared with.

    Returns
    -------
    list of (Figure, str)
        Each figure with its alt text, which names the run.
    """
    import matplotlib.pyplot as plt

    from . import plots
    from .run import band_table, slot_table, width_table

    slots, bands = slot_table(run, epsilon=epsilon, reference=reference), band_table(run, epsilon=epsilon, reference=reference)
    margins, flips, deltas = run_curves(run, reference)
    deltas = deltas.with_columns(band_c=pl.col("label").str.extract(r"c=(\d+) slot \d+$", 1).cast(pl.Int64))  # drift_table's label names c
    parted = {p: g["divergence_at"].drop_nulls().to_list() for (p,), g in slots.group_by(["prompt_id"])}
    panels = [
        (lambda ax: plots.plot_run_divergence(slots, declared_min=run.declared_min, ax=ax),
         lambda ax: plots.plot_margin_at_divergence(slots, epsilon=epsilon, ax=ax),
         "where each batched request parted from ref #1, and the reference margin there"),
        (lambda ax: plots.plot_margin_trace(margins, parted, epsilon=epsilon, ax=ax), lambda ax: plots.plot_delta_before_fork(deltas, ax=ax),
         "the reference margin at every step with the divergences marked, and the logprob drift before the fork"),
        (lambda ax: plots.plot_flip_curve(flips, ax=ax), lambda ax: plots.plot_band_widths(width_table(run), ax=ax),
         "P(flip | margin), and the batch widths the server formed in each band"),
        (lambda ax: plots.plot_run_decode_rate(bands, ax=ax), lambda ax: plots.plot_unique_completions(bands, ax=ax),
         "decode rate against c, unique completions against c"),
    ]
    out = []
    for left, right, alt in panels:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        left(axes[0])
        right(axes[1])
        out.append((fig, f"{run.path}: {alt}"))
    return out


def run_curves(run, reference: Any = "ref1") -> tuple[dict[str, list[float | None]], pl.DataFrame, pl.DataFrame]:
    """For the report's plots: each prompt's reference margin per step, P(flip | margin) over the run's
    batched requests, and per-step |delta logprob| before each fork (see :mod:`analysis.run`)."""
    from .run import drift_table, flip_table, reference_margins

    return reference_margins(run, reference=reference), flip_table(run, reference=reference), drift_table(run, reference=reference)


def mode_comparison(runs: Iterable[Any], *, reference: Any = "ref1") -> pl.DataFrame:
    """Runs side by side (for example one experiment's kernel modes): the parity each bought against the
    m=1 reference and what it cost in decode rate, per run and band, as the Thinking Machines study
    compares them. ``rate_vs_default`` is the run's median per-request decode rate over that of the
    ``default``-mode run in the same folder at the same c (null without one)."""
    from .run import slot_table

    rows = []
    for run in runs:
        slots = slot_table(run, reference=reference)
        mode = (run.manifest.get("effective") or {}).get("kernel_mode") or _engine_label(run)
        for (c,), group in slots.group_by(["band_c"], maintain_order=True):
            rates = group["decode_tok_s"].drop_nulls()
            rows.append({"run": str(run.path), "kernel_mode": mode, "band_c": c, "requests": group.height,
                         "bit_identical_share": float((group["bitwise_prefix"] == group["length"]).mean()),
                         "token_flips": int(group["diverged"].sum()), "max_ulp": group["max_ulp"].max(),
                         "median_decode_tok_s": float(rates.median()) if rates.len() else None})
    if not rows:
        return pl.DataFrame(schema={"run": pl.String, "band_c": pl.Int64})
    _against_default(rows)
    return pl.DataFrame(rows).sort("band_c", "run")


def _against_default(rows: list[dict]) -> None:
    """Set each row's ``rate_vs_default``: its median rate over the default-mode run's beside it at the same c."""
    folder = lambda row: str(Path(row["run"]).parent)  # noqa: E731
    base = {(folder(r), r["band_c"]): r["median_decode_tok_s"] for r in rows if r["kernel_mode"] == "default"}
    for row in rows:
        default_rate, rate = base.get((folder(row), row["band_c"])), row["median_decode_tok_s"]
        row["rate_vs_default"] = rate / default_rate if rate is not None and default_rate else None


def mode_comparison_html(runs: Iterable[Any], *, reference: Any = "ref1") -> str:
    """:func:`mode_comparison` for people: one row per run, each measure listed over the ladder's c."""
    frame = mode_comparison(runs, reference=reference)
    if frame.is_empty():
        return table_html(frame, empty="No batched requests in the runs.")
    rows = []
    for (run, mode), group in frame.sort("band_c").group_by(["run", "kernel_mode"], maintain_order=True):
        rows.append({"run": run, "kernel mode or engine": mode, "c": " / ".join(str(c) for c in group["band_c"]),
                     "bit-identical to m=1": " / ".join(percent(round(f * n), n) for f, n in group.select("bit_identical_share", "requests").rows()),
                     "token flips": int(group["token_flips"].sum()), "max ULP": group["max_ulp"].max(),
                     "median decode tok/s": " / ".join(cell(None if r is None else round(r)) for r in group["median_decode_tok_s"]),
                     **({"rate over the default mode's": " / ".join(cell(None if r is None else round(r, 2)) for r in group["rate_vs_default"])}
                        if "rate_vs_default" in group.columns else {})})
    return table_html(pl.DataFrame(rows).sort("run"), caption="Each measure is listed in the order of the c column.")


def _engine_label(run) -> str:
    """What served a run that names no kernel mode: the engine the probe detected, else the run's folder."""
    engine = (run.manifest.get("identity") or {}).get("engine")
    folder = Path(run.path).name if run.path else "run"
    return f"{engine} ({folder})" if engine else folder


# --- running the notebook ------------------------------------------------------------------


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
    parameters = {
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
        if not (Path(run) / "manifest.json").exists():
            raise ReportError(f"{run}: not a run directory (no manifest.json)")
    output = claim_output(output, force=force, what="the report")
    if executed_notebook:
        claim_output(executed_notebook, force=force, what="the executed notebook")
    show = progress if progress is not None else sys.stderr.isatty()
    return execute_to_html(notebook_path(), parameters, output, what="report", executed_notebook=executed_notebook, progress=show,
                           timeout_s=timeout_s)


def execute_to_html(notebook: Path, parameters: Mapping[str, Any], output: Path, *, what: str,
                    executed_notebook: str | os.PathLike[str] | None = None, progress: bool = False, timeout_s: int = 600) -> Path:
    """Execute ``notebook`` with papermill and write it to ``output`` as one offline HTML file (:func:`export_html`);
    a failing cell is a :class:`ReportError` naming the notebook's own error. ``output`` is already claimed."""
    import papermill

    with tempfile.TemporaryDirectory(prefix="bia-report-") as tmp:
        executed = Path(executed_notebook) if executed_notebook else Path(tmp) / notebook.name
        try:
            papermill.execute_notebook(
                str(notebook),
                str(executed),
                parameters=dict(parameters),
                progress_bar=progress,
                cwd=os.getcwd(),
                execution_timeout=timeout_s,
                kernel_name="python3",
                language="python",
            )
        except papermill.PapermillExecutionError as exc:
            raise ReportError(f"the {what} notebook failed: {exc.ename}: {exc.evalue}") from None
        html = export_html(executed)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(html, encoding="utf-8")
    return output


def _once(given: Iterable[Any], what: str) -> list[str]:
    """The sources or runs given, each once (a repeat is said, as a warning, and left out)."""
    from ._sources import SourceRepeated, same_sources

    kept, repeated = same_sources(given)
    for first, again in repeated:
        warnings.warn(f"{what} {again} is {first} given again; it is read once", SourceRepeated, stacklevel=3)
    return kept


def export_html(notebook: str | os.PathLike[str]) -> str:
    """Export an executed notebook as self-contained HTML: code hidden, nothing from the network."""
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(
        template_name="bia",
        extra_template_basedirs=[str(_HERE / "templates" / "nbconvert")],
        exclude_input=True,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )
    node = nbformat.read(os.fspath(notebook), as_version=4)
    # the page's <title> is the report's: papermill keeps the parameters it injected in the notebook's metadata
    title = (node.metadata.get("papermill") or {}).get("parameters", {}).get("title") or node.metadata.get("title", DEFAULT_TITLE)
    node.metadata["title"] = title  # the lab template prefers the notebook's own title to the resources' name
    body, _ = exporter.from_notebook_node(node, resources={"metadata": {"name": title}})
    return body
