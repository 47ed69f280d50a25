"""``REPORT.md``: what a user pastes into an engine's issue tracker, from the run's manifest, its judgement row and the
shrink's steps; and the parting token's two logprobs, read from the minimal run."""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from ..run import Run


def parting_token(run: Run, first: Mapping[str, Any]) -> dict[str, Any] | None:
    """The token where ``first`` (a judgement row's ``first_request``) parts from ref #1, both sides read from the run:
    ``position``, ``what`` (the chosen token, or the first top-logprob candidate that differs) and ``alone`` and ``other``
    (each ``token`` and ``logprob``); None when the run holds neither at that position.

    Parameters
    ----------
    run : Run
        The run.
    first : mapping
        Its judgement's ``first_request``.

    Returns
    -------
    dict or None

    Examples
    --------
    >>> from analysis import judge, read_run
    >>> run = read_run("data/experiment-cpu/default")
    >>> part = parting_token(run, judge(run).to_dicts()[0]["first_request"])
    >>> part["position"], part["alone"]["logprob"] != part["other"]["logprob"]
    (1, True)
    """
    position = first.get("position")
    if position is None:
        return None
    keys = ["source", "record", "choice_index"]
    run = run.prompt_run(first["prompt_id"])  # its tokens: from its piece when the run is streamed
    requests = run.dump.requests.select(*keys, "role", "c", "slot", "repeat")
    alone = requests.filter((pl.col("role") == "reference") & (pl.col("slot") == 0))
    if first.get("role") == "ref #2":
        other = requests.filter((pl.col("role") == "reference") & (pl.col("slot") == 1))
    else:
        other = requests.filter(
            ~pl.col("role").is_in(["reference", "filler"])
            & (pl.col("c") == first["c"])
            & (pl.col("slot") == first["slot"])
            & pl.col("repeat").eq_missing(first["repeat"])
        )
    if not alone.height or not other.height:
        return None

    def side(request: pl.DataFrame) -> list[tuple[Any, Any]]:
        """The request's chosen token at ``position``, then its top-logprob candidates in their order."""
        chosen = run.dump.tokens.join(request.head(1), on=keys).filter(pl.col("position") == position)
        listed = (
            run.dump.candidates.join(request.head(1), on=keys)
            .filter((pl.col("position") == position) & (pl.col("list_kind") == "top_logprobs"))
            .sort("list_index")
        )
        # a token without text (an in-process run records ids only) is named by its id
        named = pl.coalesce("token_text", pl.format("token_id:{}", "token_id"))
        listed_named = pl.coalesce("cand_token_text", pl.format("token_id:{}", "cand_token_id"))
        return chosen.select(named, "logprob").rows() + listed.select(listed_named, "cand_logprob").rows()

    mine, theirs = side(alone), side(other)
    # the chosen token first, then the candidates: the first entry that differs is the one to show (bia compares both)
    rank = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), 0)
    if rank >= len(mine) or rank >= len(theirs):
        return None
    return {
        "position": int(position),
        "what": "the chosen token" if rank == 0 else f"top_logprobs candidate {rank - 1}",
        "alone": {"token": mine[rank][0], "logprob": mine[rank][1]},
        "other": {"token": theirs[rank][0], "logprob": theirs[rank][1]},
    }


def bits(value: float | None, precision: str = "float32") -> str:
    """A logprob's bits at ``precision`` as hex (what repro.py prints).

    Parameters
    ----------
    value : float or None
        The logprob.
    precision : {"float32", "float64"}
        The precision the run recorded.

    Returns
    -------
    str

    Examples
    --------
    >>> bits(-0.5), bits(-0.5, "float64"), bits(None)
    ('bf000000', 'bfe0000000000000', 'none')
    """
    if value is None:
        return "none"
    return struct.pack(">d" if precision == "float64" else ">f", value).hex()


def _fence(text: str, language: str = "") -> str:
    """``text`` in a Markdown code fence longer than any run of backticks it holds: untrusted text stays text."""
    ticks = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return f"{ticks}{language}\n{text}\n{ticks}"


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ") if value is not None else ""


def report_text(
    *,
    manifest: Mapping[str, Any],
    row: Mapping[str, Any],
    command: str,
    case_words: str | None,
    body: Mapping[str, Any] | None,
    batch_words: str | None,
    part: Mapping[str, Any] | None,
    precision: str,
    steps: Sequence[str],
    spent: str,
    outcome: str,
    script_note: str | None = None,
) -> str:
    """REPORT.md's text: the engine, version, flags and hardware as the run recorded them, the verdict row, the minimal request as
    JSON, the bits, the command, and what shrinking tried.

    Parameters
    ----------
    manifest : mapping
        The manifest of the run whose engine is named (the minimal run's, else the run's).
    row : mapping
        The run's judgement row.
    command : str
        The command that made the repro.
    case_words, batch_words : str or None
        The minimal case and its batch in words (None: no case).
    body : mapping or None
        The minimal request.
    part : mapping or None
        :func:`parting_token`'s answer, with the other side's ``label``.
    precision : str
        The precision the bits are shown in.
    steps : sequence of str
        What shrinking tried.
    spent, outcome : str
        What it spent, and what it found, in words.
    script_note : str, optional
        What ``repro.py`` needs and does (by default: the standalone HTTP script's words).

    Returns
    -------
    str

    Examples
    --------
    >>> text = report_text(manifest={"identity": {"engine": "bia serve"}}, row={"run": "r", "arm": "copies", "verdict": "RED",
    ...     "cause": "co-batching", "evidence": "e", "first": "p0 c=2"}, command="bia repro r", case_words=None, body=None,
    ...     batch_words=None, part=None, precision="float32", steps=[], spent="0 requests", outcome="not reproducible at 3 tries")
    >>> text.splitlines()[0]
    '# bia serve: not reproducible at 3 tries'
    """
    identity = manifest.get("identity") or {}
    engine = manifest.get("engine") or {}
    effective = manifest.get("effective") or {}
    info = (manifest.get("server") or {}).get("info") or {}
    version = next(
        (
            str(v)
            for v in (
                identity.get("version"),
                effective.get("build_info"),
                effective.get("version"),
                info.get("version"),
                info.get("build_info"),
            )
            if v
        ),
        "not reported by the server",
    )
    lines = [f"# {identity.get('engine') or 'the engine'}: {outcome}", ""]
    lines += ["## Engine, as the run recorded it", ""]
    lines += [
        f"- engine: {identity.get('engine') or 'unknown'} (bia's profile `{engine.get('profile', 'unknown')}`; "
        f"{'; '.join(engine.get('evidence') or []) or 'not detected'})",
        f"- model: `{(identity.get('model') or {}).get('path') or 'unknown'}`",
        f"- version: {version}",
        f"- settings the server reports (flags): `{json.dumps(effective, sort_keys=True)}`",
        f"- hardware: host `{identity.get('host', 'unknown')}`; `{json.dumps(manifest.get('environment') or {}, sort_keys=True)}`",
        f"- the run: `{row['run']}`, made by {manifest.get('producer', 'unknown')} against `{manifest.get('url', 'unknown')}`",
        "",
        "## Verdict (bia's judgement of the run)",
        "",
        "| arm | verdict | cause | evidence | first part |",
        "|---|---|---|---|---|",
        f"| {_cell(row['arm'])} | {_cell(row['verdict'])} | {_cell(row['cause'])} | {_cell(row['evidence'])} | {_cell(row['first'])} |",
        "",
    ]
    if body is not None:
        lines += [
            "## The minimal request",
            "",
            f"{case_words}; {batch_words}",
            "",
            _fence(json.dumps(body, indent=2), "json"),
            "",
        ]
    if part is not None:
        lines += [
            "## The bits",
            "",
            f"The first token that parts, token {part['position']}, {part['what']} ({precision} bits):",
            "",
        ]
        table = "\n".join(
            f"{label:<8} {side['token']!r:<12} logprob {side['logprob']!r:<24} bits 0x{bits(side['logprob'], precision)}"
            for label, side in (("alone", part["alone"]), (part.get("label", "batched"), part["other"]))
        )
        lines += [_fence(table), ""]
    lines += ["## How it was found", "", _fence(command, "bash"), ""]
    if body is not None:
        lines += [
            script_note
            or (
                "`python3 repro.py` (Python's standard library only) sends it again: exit 1 while it parts, 0 once it does not "
                "(`--url` another server, `--tries N`)."
            ),
            "",
        ]
    lines += ["## What shrinking tried", ""]
    lines += [f"- {step}" for step in steps] or [
        "- nothing: no server was given, so the run's own request is the repro"
    ]
    lines += ["", f"Spent: {spent}.", ""]
    return "\n".join(lines)
