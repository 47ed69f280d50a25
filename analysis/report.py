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
import sys
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from ._frames import as_polars
from ._html import render
from ._output import claim_output
from ._v3 import ShapeVerdict, V3Policy

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


def _rows(frame: pl.DataFrame) -> list[dict[str, Any]]:
    return frame.to_dicts()


def _short(commit: str | None) -> str:
    return commit[:10] if commit else ""


def header_html(title: str, parameters: Mapping[str, Any], ws, policy: V3Policy, runs: Iterable[Any] = ()) -> str:
    """Title, parameters as given, the policy in force, and the provenance of every file and run."""
    files = []
    for row in ws.to_backend("polars").witnesses.iter_rows(named=True):
        files.append({"source": row["source"], "kind": "witness", "version": row["witness_version"], "host": row["host"], "commit": _short(row["commit"])})
    for row in ws.to_backend("polars").markers.iter_rows(named=True):
        files.append({"source": row["source"], "kind": "release marker", "version": "", "host": row["host"], "commit": _short(row["commit"])})
    for row in files:
        row["sha256"] = hashlib.sha256(ws.texts[row["source"]].encode("utf-8")).hexdigest()[:16]
    for run in runs:
        identity = run.manifest.get("identity", {}) or {}
        manifest = (run.path / "manifest.json").read_bytes() if run.path else b""
        files.append({"source": str(run.path), "kind": "run", "version": run.manifest.get("run_version", 1), "host": identity.get("host"),
                      "commit": _short(identity.get("commit")), "sha256": hashlib.sha256(manifest).hexdigest()[:16] + " (manifest)"})
    return render(
        "header.html.j2",
        title=title,
        generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        version=_version(),
        parameters=parameters,
        policy=dataclasses.asdict(policy),
        files=files,
        readmes=_readmes(ws.sources),
    )


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


def verdicts_html(ws, verdicts: Mapping[str, ShapeVerdict]) -> str:
    """Each witness's recorded and re-derived run verdict, its V3 verdict, and every discrepancy."""
    polars_set = ws.to_backend("polars")
    witnesses = []
    for row in polars_set.witnesses.iter_rows(named=True):
        witnesses.append(
            {
                "source": row["source"],
                "version": row["witness_version"],
                "host": row["host"],
                "commit": _short(row["commit"]),
                "model": row["model_path"],
                "recorded": row["recorded_verdict"],
                "derived": row["derived_verdict"],
                "agrees": row["verdict_agrees"],
                "verdict": verdicts[row["source"]],
            }
        )
    return render("verdicts.html.j2", witnesses=witnesses, discrepancies=_rows(polars_set.discrepancies))


def table_html(frame: Any, *, caption: str = "", empty: str = "nothing to show") -> str:
    """Any frame as an escaped HTML table (polars or pandas)."""
    frame = as_polars(frame)
    rows = [[_cell(v) for v in row] for row in frame.iter_rows()]
    return render("table.html.j2", columns=frame.columns, rows=rows, caption=caption, empty=empty)


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.4g}"
    return value


BANDS_COLUMNS = (
    "witness",
    "c",
    "m_formed",
    "n_slots",
    "divergence_at",
    "declared_min",
    "top2_margin_at_divergence",
    "intra_agree_to",
    "max_constant_run",
    "decode_tok_s",
    "result",
    "derived_result",
)


def bands_html(ws) -> str:
    """The bands of every witness: shape served, agreement with m=1, rate, recorded and derived result."""
    from .plots import witness_label

    bands = ws.to_backend("polars").bands
    labels = [witness_label(s, v) for s, v in bands.select("source", "witness_version").iter_rows()]
    bands = bands.with_columns(pl.Series("witness", labels, dtype=pl.String)).select(BANDS_COLUMNS)
    bands = bands.rename({"top2_margin_at_divergence": "margin at divergence", "decode_tok_s": "decode tok/s", "derived_result": "derived result"})
    return table_html(bands, empty="No bands: no witness measured any.")


def markers_html(ws) -> str:
    """Release markers, if any were read."""
    markers = ws.to_backend("polars").markers.drop("extra")
    return table_html(markers, empty="No release markers among the sources.")


def show_figure(ax_or_figure, alt: str) -> None:
    """Display a figure as a PNG whose alt text describes it, then close it.

    The exported HTML carries ``alt`` on the image, for screen readers and for tests.
    """
    from io import BytesIO

    import matplotlib.pyplot as plt
    from IPython.display import Image, display

    figure = getattr(ax_or_figure, "figure", ax_or_figure)
    buffer = BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    display(Image(data=buffer.getvalue(), format="png", metadata={"alt": alt}))


# --- runs ---------------------------------------------------------------------------------------------


def _token_labels(run) -> dict[Any, str]:
    """A readable label for each token identity: its text when the dump had one, else ``id N``."""
    labels: dict[Any, str] = {}
    for token_id, text, data in run.dump.tokens.select("token_id", "token_text", "token_bytes").iter_rows():
        if token_id is not None and text is not None:
            labels.setdefault(token_id, text)
        elif token_id is not None and data is not None:
            labels.setdefault(token_id, data.decode("utf-8", errors="replace"))
    return labels


def _label(identity: Any, labels: Mapping[Any, str]) -> str:
    if isinstance(identity, tuple):
        text, data = identity
        return text if text is not None else (data or b"").decode("utf-8", errors="replace")
    return labels.get(identity, f"id {identity}")


def negative_control(run, prompt_id: str) -> dict[str, Any]:
    """Plant a divergence in a copy of ref #1 (a token it never produced, at its middle step) and check that it is found."""
    from . import parity

    refs = run.dump.requests.filter((pl.col("role") == "reference") & (pl.col("prompt_id") == prompt_id)).sort("slot")
    row = refs.row(0, named=True)
    one = pl.col("source").eq_missing(row["source"]) & pl.col("record").eq_missing(row["record"]) & pl.col("choice_index").eq_missing(row["choice_index"])
    reference = next(iter(parity.streams(run.dump.tokens.filter(one)).values()), parity.Stream(("none",), ()))
    at = len(reference) // 2
    planted = list(reference.identities)
    if planted:
        planted[at] = ("<planted>", b"\x00planted")
    found = parity.compare(reference, parity.Stream(("control",), tuple(planted)))
    return {"prompt_id": prompt_id, "planted_at": at, "found_at": found.divergence_at, "detected": bool(planted) and found.divergence_at == at}


def _settings(manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    requested, effective = manifest.get("requested", {}) or {}, manifest.get("effective", {}) or {}
    # a setting differs only when both sides name it: the probe's own choices (layout, ...) have no server-side twin
    return [{"name": k, "requested": requested.get(k), "effective": effective.get(k),
             "differs": k in requested and k in effective and requested[k] != effective[k]}
            for k in sorted(set(requested) | set(effective))]


def run_html(run, policy: V3Policy | None = None) -> str:
    """A run's provenance, settings, negative control, V3 verdict per prompt, and the forks of its bands."""
    from ._v3 import shape_check_data
    from .run import band_forks, to_witness

    manifest = run.manifest
    identity = manifest.get("identity", {}) or {}
    prompts = sorted({p for p in run.dump.requests["prompt_id"].to_list() if p is not None})
    witnesses = []
    for prompt in prompts:
        w = to_witness(run, prompt)
        witnesses.append({"prompt_id": prompt, "result": w["result"], "reference_reason": w["reference"].get("reason"),
                          "verdict": shape_check_data(w, source=f"{run.path or 'run'} prompt {prompt}", policy=policy)})
    labels, forks = _token_labels(run), []
    for (prompt, c, repeat, at), group in band_forks(run).group_by(["prompt_id", "band_c", "repeat", "at"], maintain_order=True):
        branches = [(_label(token_id if token_id is not None else (text, data), labels), n)
                    for token_id, text, data, n in group.select("token_id", "token_text", "token_bytes", "slots").rows() if n is not None]
        forks.append({"prompt_id": prompt, "band_c": c, "repeat": repeat, "at": at, "branches": branches})
    return render("run.html.j2", run=run, identity={"host": identity.get("host"), "commit": identity.get("commit"),
                  "model_path": (identity.get("model") or {}).get("path"), "engine": identity.get("engine"),
                  "engine_said": (manifest.get("engine") or {}).get("said")},
                  ladder=run.ladder, declared_min=run.declared_min, sampler=manifest.get("sampler"), environment=manifest.get("environment"),
                  settings=_settings(manifest), controls=[negative_control(run, p) for p in prompts], witnesses=witnesses, forks=forks,
                  missing=run.missing(), refused=manifest.get("refused", []), complete=manifest.get("complete", True),
                  skipped=run.dump.skipped)


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


def _engine_label(run) -> str:
    """What served a run that names no kernel mode: the engine the probe detected, else the run's folder."""
    engine = (run.manifest.get("identity") or {}).get("engine")
    folder = Path(run.path).name if run.path else "run"
    return f"{engine} ({folder})" if engine else folder


def run_tables_html(run, *, epsilon: float, reference: Any = "ref1") -> str:
    """The run's prompt, band and per-request tables."""
    from .run import accuracy_table, band_table, observer_table, prompt_table, slot_table

    against = reference if isinstance(reference, str) else f"ref #1 of {reference.path}"
    prompts = prompt_table(run, reference=reference)
    bands = band_table(run, epsilon=epsilon, reference=reference)
    slots = slot_table(run, epsilon=epsilon, reference=reference).drop("source", "record")
    return (table_html(prompts, caption="Prompts: the reference's tie density, Div_Index and Avg_Std@top1_prob across configurations, "
                                        "and S7's c=4/c=1 decode-rate ratio with a bootstrap interval.")
            + table_html(bands, caption=f"Bands: divergence from {against} over slots, agreement inside the batch, completions, decode rate.")
            + table_html(slots, caption=f"Requests: each batched request against {against} (positions 0-based).")
            + _observer_html(observer_table(run))
            + _accuracy_html(*accuracy_table(run)))


def _accuracy_html(table: pl.DataFrame, std: float | None) -> str:
    """Accuracy per configuration and Std@Acc, when the run's prompts carry answers."""
    if table.is_empty():
        return ""
    return table_html(table, caption=f"Accuracy against the prompts' answers per configuration (ref #1, and slot 0 of each band); "
                                     f"Std@Acc across them = {std:.4g}.")


def _observer_html(observed: pl.DataFrame) -> str:
    """The observer-effect check, when the run fired each band a second time without logprobs."""
    if observed.is_empty():
        return ""
    changed = observed.filter(pl.col("texts_equal").not_())
    summary = (f"{changed.height} of {observed.height} request(s) fired without logprobs gave a different text: asking for logprobs changed the output."
               if changed.height else f"All {observed.height} request(s) fired without logprobs gave the same text as with them.")
    return table_html(observed, caption=f"Observer effect: each band fired again without logprobs, texts compared slot by slot. {summary}")


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
    import papermill

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
    }
    V3Policy.from_mapping(parameters["policy"])  # refuse a bad policy before starting a kernel
    for run in parameters["runs"]:
        if not (Path(run) / "manifest.json").exists():
            raise ReportError(f"{run}: not a run directory (no manifest.json)")
    output = claim_output(output, force=force, what="the report")
    if executed_notebook:
        claim_output(executed_notebook, force=force, what="the executed notebook")
    show = progress if progress is not None else sys.stderr.isatty()
    with tempfile.TemporaryDirectory(prefix="bia-report-") as tmp:
        executed = Path(executed_notebook) if executed_notebook else Path(tmp) / "parity_report.ipynb"
        try:
            papermill.execute_notebook(
                str(notebook_path()),
                str(executed),
                parameters=parameters,
                progress_bar=show,
                cwd=os.getcwd(),
                execution_timeout=timeout_s,
                kernel_name="python3",
                language="python",
            )
        except papermill.PapermillExecutionError as exc:
            raise ReportError(f"the report notebook failed: {exc.ename}: {exc.evalue}") from None
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
    body, _ = exporter.from_notebook_node(node, resources={"metadata": {"name": node.metadata.get("title", DEFAULT_TITLE)}})
    return body
