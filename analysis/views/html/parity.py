"""The parity report's fragments: the answer, the verdict cards, the runs side by side, the engines, V3's gate, each run's
and witness set's detail, and the provenance, each rendered as escaped HTML with jinja2 (the notebook only displays them)."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Mapping
from html import escape
from pathlib import Path
from typing import Any

import polars as pl

from ...core import MISSING, cell, kernel_mode_words, pairs, percent, render
from ...run import RunError
from ...studies import default_engine_reference, engine_label, engine_table, mode_comparison
from ...verdicts import ShapeVerdict, V3Policy
from ..plots.witness import differing_env_knobs
from .attribution import attribution_html
from .first_ops import first_op_html
from .review import run_review, witness_reviews
from .tables import markers_html, run_admission, run_html, run_tables_html, table_html, witness_bands_html

# --- HTML fragments the notebook displays --------------------------------------------------


def _short(commit: str | None) -> str:
    return commit[:10] if commit else MISSING


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


_LONG_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d{5,}(?:[eE][-+]?\d+)?(?![\w.])")


def rounded(text: str) -> str:
    """A reason with its long decimals rounded for people; V3's own text keeps every digit.

    Parameters
    ----------
    text : str
        A verdict's reason.

    Returns
    -------
    str

    Examples
    --------
    >>> rounded("per-request decode at c=4 is 102.92960513109377 tok/s, 3.5% of c=1's 2940.1234567 tok/s")
    "per-request decode at c=4 is 102.9 tok/s, 3.5% of c=1's 2,940 tok/s"
    """
    return _LONG_DECIMAL.sub(lambda m: cell(float(m.group(0))), text)


def _for_people(verdict: ShapeVerdict) -> dict[str, Any]:
    """A V3 verdict as the report shows it: its status and exit code, the reasons' numbers rounded."""
    return {
        "status": verdict.status,
        "exit_code": verdict.exit_code,
        "source": verdict.source,
        "reasons": [rounded(r) for r in verdict.reasons],
    }


def verdicts_html(ws, verdicts: Mapping[str, ShapeVerdict]) -> str:
    """Each witness's recorded and re-derived run verdict, its V3 verdict, and every discrepancy.

    Parameters
    ----------
    ws : WitnessSet
        The witness set.
    verdicts : mapping of str to ShapeVerdict
        Each witness's V3 verdict, by source.

    Returns
    -------
    str
        HTML.
    """
    polars_set = ws.to_backend("polars")
    witnesses = [
        {
            "source": row["source"],
            "version": cell(row["witness_version"]),
            "host": cell(row["host"]),
            "commit": _short(row["commit"]),
            "model": cell(row["model_path"]),
            "recorded": row["recorded_verdict"],
            "derived": cell(row["derived_verdict"]),
            "agrees": row["verdict_agrees"],
            "verdict": _for_people(verdicts[row["source"]]),
        }
        for row in polars_set.witnesses.iter_rows(named=True)
    ]
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
    judged = []
    for run in runs:
        groups = run_admission(run, policy)
        judged.append({"path": run.label, "groups": [_group(run, g) for g in groups]})
    return render(
        "admission.html.j2",
        policy=policy,
        bands=cell(list(policy.bands)),
        ratio=f"{policy.s7_ratio:.0%}",
        witnesses=verdicts_html(ws, verdicts) if ws.sources else "",
        runs=judged,
    )


def _group(run, group: Mapping[str, Any]) -> dict[str, Any]:
    """Prompts with one V3 verdict, the verdict named after all of them."""
    names = _names(group["prompts"])
    verdict = {
        **_for_people(group["verdict"]),
        "source": f"{run.label}, prompt{'s' if len(group['prompts']) > 1 else ''} {names}",
    }
    return {**group, "verdict": verdict, "names": names}


def _names(items: list[str], n: int = 8) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


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


def _verdicts(judgement: Any, runs: list[Any]) -> dict[str, dict[str, Any]]:
    """Each run's judgement in one row: the worst arm's verdict and cause, and the run's one ULP figure (batched against m=1)."""
    from ...studies import judge

    judgement = judge(runs) if judgement is None else judgement
    out: dict[str, dict[str, Any]] = {}
    for row in judgement:
        held = out.get(row["run"])
        if held is None or _WORSE.index(row["verdict"]) > _WORSE.index(held["verdict"]):
            out[row["run"]] = {
                **row,
                "max_ulp": max(
                    [u for u in (row["max_ulp"], (held or {}).get("max_ulp")) if u is not None], default=None
                ),
            }
    return out


_WORSE = ("GREEN", "AMBER", "UNVERIFIED", "RED")


def mode_comparison_html(runs: Iterable[Any], *, reference: Any = "ref1", judgement: Any = None) -> str:
    """:func:`mode_comparison` for people: one row per run, its verdict and its one ULP figure (:func:`analysis.judge`'s),
    then each measure listed over the ladder's c.

    Parameters
    ----------
    runs : iterable of Run
        The runs.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with, as :func:`analysis.mode_comparison` takes it.
    judgement : Judgement, optional
        The report's judgement (:func:`judge_report`), whose verdicts the rows show; by default the runs are judged
        here.

    Returns
    -------
    str
        HTML.
    """
    runs = list(runs)
    verdicts = _verdicts(judgement, runs)
    frame = mode_comparison(runs, reference=reference)
    if frame.is_empty():
        return table_html(frame, empty="No batched requests in the runs.")
    rows = []
    asked = {
        run.label: kernel_mode_words(run.manifest) for run in runs
    }  # a mode as asked, with the one that ran when they differ
    for (run, mode), group in frame.sort("c").group_by(["run", "kernel_mode"], maintain_order=True):
        judged = verdicts.get(run) or {}
        rows.append(
            {
                "run": run,
                "verdict": judged.get("verdict", MISSING),
                "kernel mode or engine": asked.get(run) or mode,
                "c": " / ".join(str(c) for c in group["c"]),
                "bit-identical to m=1": " / ".join(
                    percent(round(f * n), n) for f, n in group.select("bit_identical_share", "requests").rows()
                ),
                "token flips": int(group["token_flips"].sum()),
                "max ULP, batched against m=1": cell(judged.get("max_ulp")),
                "median decode tok/s": " / ".join(
                    cell(None if r is None else round(r)) for r in group["median_decode_tok_s"]
                ),
                "rate over the default mode's": _rate_vs_default(group["rate_vs_default"]),
            }
        )
    caption = (
        "The verdict and max ULP are the run's judgement (the answer above): the largest ULP distance of a batched request's "
        "logprob from its m=1 reference. Each measure is listed in the order of the c column. The rate over the default mode's is the run's median decode rate "
        "over that of the default-mode run in the same folder at the same c: it needs such a run beside it, which a run that names "
        "no kernel mode (llama.cpp's, for one) does not have."
    )
    return table_html(pl.DataFrame(rows).sort("run"), caption=caption)


def engines_html(runs: Iterable[Any], *, judgement: Any = None) -> str:
    """:func:`analysis.engine_table` for people, when the runs come from more than one engine: one row per run, against
    the reference engine (torch in its default kernel mode where there is one), and whether each is batch invariant by itself.
    Empty when the runs come from one engine or hold no prompt in common.

    Parameters
    ----------
    runs : iterable of Run
        The runs.
    judgement : Judgement, optional
        The report's judgement (:func:`judge_report`), whose verdicts the rows show; by default the runs are judged
        here.

    Returns
    -------
    str
        HTML.
    """
    runs = list(runs)
    if len({(r.manifest.get("identity") or {}).get("engine") for r in runs}) < 2:
        return ""
    reference = runs[default_engine_reference(runs)]
    try:
        table = engine_table(runs, reference=reference)
    except RunError as exc:  # runs of other prompts: nothing to put side by side, and the reason is said
        return table_html(pl.DataFrame(), empty=f"The engines cannot be compared: {exc}")
    verdicts = _verdicts(judgement, runs)
    rows = []
    for (engine, run), group in table.group_by(["engine", "run"], maintain_order=True):
        alone = group.filter(pl.col("role") == "m=1").row(0, named=True)
        bands = group.filter(pl.col("role") == "band").sort("c")
        judged = verdicts.get(run) or {}
        rows.append(
            {
                "engine (run)": f"{engine}: {run}",
                "verdict (its own m=1)": judged.get("verdict", MISSING),
                "m=1 against the reference engine's m=1": _against_reference(alone),
                "c": " / ".join(str(c) for c in bands["c"]),
                "token-identical to the reference's m=1": " / ".join(
                    f"{s} of {n}" for s, n in bands.select("token_identical", "requests").rows()
                ),
                "bits from token": " / ".join(cell(b) for b in bands["min_bitwise_prefix"]),
                # against its own m=1: from which c batching changes this engine's bits (padded batching, a kernel mode...)
                "bit-identical to its own m=1": " / ".join(
                    MISSING if v is None else f"{v:.0%}" for v in bands["own_m1_bit_identical"]
                ),
            }
        )
    caption = (
        f"The reference engine is {engine_label(reference)} ({reference.label}): each run's m=1 stream and its batched requests "
        "are compared with the reference's m=1 stream of the same prompt. 'Bits from token' is the shortest prefix of float32 "
        "logprobs bit-identical to it (the length of the stream when every bit matches); its ULP figures are engine against "
        "engine, not the run's own. The verdict is the run's judgement against its own m=1 (the answer above), and the last column the "
        "share of each c's requests bit-identical to the run's own m=1: where batching starts to change that engine's bits."
    )
    return table_html(pl.DataFrame(rows), caption=caption)


def _against_reference(row: dict[str, Any]) -> str:
    """One engine's m=1 streams against the reference engine's, in words."""
    tokens = (
        f"{row['token_identical']} of {row['requests']} token-identical"
        if row["earliest_divergence"] is None
        else f"{row['token_identical']} of {row['requests']} token-identical, the first parting at token {row['earliest_divergence']}"
    )
    if not row["max_ulp"]:
        return tokens + "; every logprob bit-identical"
    return (
        f"{tokens}; bits from token {row['min_bitwise_prefix']}, up to {row['max_ulp']:,} ULP against the reference engine "
        f"(|delta logprob| up to {cell(row['max_abs_delta'])})"
    )


def _rate_vs_default(rates: pl.Series) -> str:
    """Each c's rate over the default mode's, or why there is none: no default-mode run beside the run.

    Examples
    --------
    >>> _rate_vs_default(pl.Series([1.0, 0.4567, None])), _rate_vs_default(pl.Series([None, None], dtype=pl.Float64))
    ('1 / 0.46 / —', 'no default-mode run in its folder')
    """
    if rates.is_null().all():
        return "no default-mode run in its folder"
    return " / ".join(cell(None if r is None else round(r, 2)) for r in rates)
