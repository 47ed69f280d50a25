"""What a repro sends: the case (prompt, batch, length) taken from a run's first parting request, and the probe settings
and request bodies it becomes."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import polars as pl

from ..probe import DEFAULT_FILLERS, PROFILES, ProbeSettings, band_rows, request_body
from ..run import Run, plan, slot_table
from ..studies import judge

#: The causes of a part seen alone (``analysis.judge``'s rule 1): their repro is the same request twice, never a batch.
ALONE_CAUSES = ("run-to-run", "prompt cache")


def cold_template(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The fields that make one request of the run's engine skip its prompt cache (``{"cache_prompt": False}`` on llama.cpp,
    a ``"{salt}"`` made fresh per request on vLLM); ``{}`` for an engine that has none.

    A repro seen alone sends its first request with them (a full prefill, the same bits every time), then the request as
    the server takes it by default twice: the first warms the cache with this very prompt, the second is compared. On
    llama.cpp that second send finds its whole prompt cached and evaluates only the prompt's last token, alone, where the
    uncached one evaluated it with the whole prompt (other matmul shapes, other bits); with ``--no-cache-prompt`` all three
    are full prefills. Nothing turns the cache on by hand: a request with ``cache_prompt: true`` would override the flag.

    Parameters
    ----------
    manifest : mapping
        The run's manifest (its engine profile).

    Returns
    -------
    dict of str to Any

    Examples
    --------
    >>> cold_template({"engine": {"profile": "llamacpp"}}), cold_template({"engine": {"profile": "bia"}})
    ({'cache_prompt': False}, {})
    """
    profile = PROFILES.get((manifest.get("engine") or {}).get("profile") or "", None)
    return dict((profile.cold if profile is not None else None) or {})


class ReproError(ValueError):
    """A run or option no repro can be made of: a run with no request that parts, a ``request`` it does not hold, a
    budget that is no number; the message names the run, option or field."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One candidate repro: the prompt, the batch it is sent in (``c`` rows of ``layout``; ``c=1``: alone, twice) and its
    length.

    Examples
    --------
    >>> case = Case(prompt="If the argument is", c=2, layout="copies", fillers=(), max_tokens=3)
    >>> case.words, case.alone_only
    ('c=2 copies, max_tokens=3, prompt of 4 words', False)
    >>> case.replace(c=1).alone_only
    True
    """

    prompt: str
    c: int
    layout: str
    fillers: tuple[str, ...]
    max_tokens: int

    @property
    def alone_only(self) -> bool:
        return self.c == 1

    @property
    def words(self) -> str:
        batch = "alone, twice" if self.alone_only else f"c={self.c} {self.layout}"
        words = len(prompt_pieces(self.prompt))
        return f"{batch}, max_tokens={self.max_tokens}, prompt of {words} word{'s' if words != 1 else ''}"

    @property
    def key(self) -> str:
        """The case as one line of JSON-able text: a resumed shrink knows the candidates it already tried by it."""
        return f"{self.c}|{self.layout}|{self.max_tokens}|{self.prompt}|{'|'.join(self.fillers) if self.layout != 'copies' else ''}"

    def replace(self, **changes: Any) -> Case:
        """A copy with ``changes``.

        Parameters
        ----------
        **changes
            New values of the case's fields, by name.

        Returns
        -------
        Case
        """
        return dataclasses.replace(self, **changes)


def prompt_pieces(prompt: str) -> list[str]:
    """The prompt cut after each run of white space: the units a prefix is made of (``"".join`` gives it back).

    Parameters
    ----------
    prompt : str
        The prompt.

    Returns
    -------
    list of str

    Examples
    --------
    >>> prompt_pieces("If the  argument is")
    ['If ', 'the  ', 'argument ', 'is']
    """
    return [piece for piece in re.split(r"(?<=\s)(?=\S)", prompt) if piece]


def first_part(run: Run, request: str | None = None) -> dict[str, Any]:
    """The judgement row whose first request is reproduced: the first RED row's (``request`` unset), or the row of the arm
    that holds ``request`` (``PROMPT_ID/C/REPEAT/SLOT``, e.g. ``p0/2/0/1``) with that request as its ``first_request``.

    Parameters
    ----------
    run : Run
        The run.
    request : str, optional
        The batched request to reproduce, as ``PROMPT_ID/C/REPEAT/SLOT``; it must part from m=1 in the run.

    Returns
    -------
    dict of str to Any
        A row of :func:`analysis.judge` (``verdict``, ``cause``, ``first_request``, ...).

    Raises
    ------
    ReproError
        No row is RED, or ``request`` is malformed, not in the run, or does not part.

    Examples
    --------
    >>> from analysis import read_run
    >>> first_part(read_run("data/experiment-cpu/default"))["first_request"]["c"]
    4
    """
    rows = judge(run).to_dicts()
    if request is None:
        red = [row for row in rows if row["verdict"] == "RED" and row["first_request"]]
        if not red:
            verdicts = ", ".join(f"{row['arm']} {row['verdict']}" for row in rows) or "nothing judged"
            raise ReproError(f"{run.label}: no request parts from m=1 ({verdicts}): nothing to reproduce")
        return red[0]
    fields = request.split("/")
    try:
        prompt_id, c, repeat, slot = fields[0], int(fields[1]), int(fields[2]), int(fields[3])
    except (IndexError, ValueError):
        raise ReproError(f"--request takes PROMPT_ID/C/REPEAT/SLOT (e.g. p0/2/0/1), got {request!r}") from None
    table = slot_table(run).filter(
        (pl.col("prompt_id") == prompt_id)
        & (pl.col("c") == c)
        & pl.col("repeat").eq_missing(repeat)
        & (pl.col("slot") == slot)
    )
    if c < 2 or not table.height:
        raise ReproError(
            f"--request {request}: {run.label} holds no batched request {prompt_id} c={c} repeat {repeat} slot {slot}"
        )
    hit = table.row(0, named=True)
    position = next((hit[k] for k in ("parted_at", "bits_differ_at") if hit[k] is not None), None)
    if position is None:
        raise ReproError(f"--request {request}: that request does not part from m=1 in {run.label}")
    row = next(row for row in rows if row["arm"] == hit["arm"])
    first = {
        "prompt_id": prompt_id,
        "c": c,
        "repeat": repeat,
        "slot": slot,
        "role": f"{hit['arm']} c={c}",
        "position": position,
        "max_ulp": hit["max_ulp"],
        "parted": "tokens" if hit["parted_at"] is not None else "bits",
    }
    return {**row, "verdict": "RED", "first_request": first}


def start_case(run: Run, row: Mapping[str, Any]) -> Case:
    """The case a judgement row's first request was: its prompt, c (1 when the cause is a part seen alone), the run's
    layout and fillers, and the run's ``max_tokens``.

    Parameters
    ----------
    run : Run
        The run.
    row : mapping
        Its judgement row (:func:`first_part`).

    Returns
    -------
    Case
    """
    manifest = run.manifest
    first = row["first_request"]
    texts = {p["prompt_id"]: p["text"] for p in manifest.get("prompts") or []}
    if first["prompt_id"] not in texts:
        raise ReproError(f'{run.label}: manifest.json: field "prompts": holds no prompt {first["prompt_id"]!r}')
    others = [text for pid, text in texts.items() if pid != first["prompt_id"]]
    layout = "needle" if row["arm"] == "mixed" else ((manifest.get("requested") or {}).get("layout") or "copies")
    if manifest.get("arms") is not None and row["arm"] != "mixed":
        layout = "copies"  # the copies, serial, cache and prefix arms all send copies of the prompt
    alone = row["cause"] in ALONE_CAUSES or int(first["c"] or 1) < 2
    return Case(
        prompt=texts[first["prompt_id"]],
        c=1 if alone else int(first["c"]),
        layout=layout,
        fillers=tuple(manifest.get("fillers") or others or DEFAULT_FILLERS),
        max_tokens=int((manifest.get("sampler") or {}).get("max_tokens") or 64),
    )


def case_settings(case: Case, manifest: Mapping[str, Any], *, timeout: float, api_key: str | None) -> ProbeSettings:
    """The probe settings of one try of ``case``: the run's engine, model, seed and candidates, its prompt alone (two
    references) and one band of c, fired once (alone-only: the two references and a request alone, or, where the engine
    can skip its cache per request, the references cold and the cache arm).

    Parameters
    ----------
    case : Case
        The candidate.
    manifest : mapping
        The run it comes from (its engine, model and sampler).
    timeout : float
        Seconds each request may take.
    api_key : str, optional
        The bearer token.

    Returns
    -------
    ProbeSettings
    """
    sampler = manifest.get("sampler") or {}
    # alone, on an engine whose cache a request can skip: the references cold, then the cache arm (a primer of the prompt,
    # then the prompt on the cache it warmed), so a warm server cannot hide the part by serving both sides from its cache
    arms = ("cache",) if case.alone_only and cold_template(manifest) else None
    return ProbeSettings(
        prompts=[case.prompt],
        arms=arms,
        ladder=(1,) if case.alone_only else (case.c,),  # the two references are the alone side; no c=1 band is needed
        max_tokens=case.max_tokens,
        top_logprobs=int(sampler.get("top_logprobs", 5)),
        seed=int(sampler.get("seed", 0)),
        layout=case.layout,
        fillers=case.fillers,
        engine=(manifest.get("engine") or {}).get("profile") or "auto",
        model=((manifest.get("identity") or {}).get("model") or {}).get("path"),
        timeout=timeout,
        api_key=api_key,
        progress=False,
    )


def case_bodies(case: Case, manifest: Mapping[str, Any], first: Mapping[str, Any]) -> dict[str, Any]:
    """What repro.py sends for ``case``, as a run with ``manifest`` (a try's) sent it: the request alone, and the batch's rows
    with the row of the request that parts.

    Parameters
    ----------
    case : Case
        The case.
    manifest : mapping
        The manifest of a run that sent it (its prompts, fillers, seed, engine and model).
    first : mapping
        A judgement's ``first_request`` in that run: its prompt, repeat and slot.

    Returns
    -------
    dict of str to Any
        ``alone`` (a body), ``batch`` (a body per row; empty when alone-only) and ``row``; alone-only, ``cold`` too
        (:func:`cold_template`: the fields the first send carries).
    """
    sampler = manifest.get("sampler") or {}
    profile = PROFILES.get((manifest.get("engine") or {}).get("profile") or "", None)
    model = ((manifest.get("identity") or {}).get("model") or {}).get("path")
    body = request_body(
        case.prompt,
        max_tokens=case.max_tokens,
        top_logprobs=int(sampler.get("top_logprobs", 5)),
        seed=int(sampler.get("seed", 0)),
        profile=profile,
        model=model,
    )
    if case.alone_only:
        return {"alone": body, "batch": [], "row": None, "cold": cold_template(manifest)}
    bands = [u for u in plan(manifest) if u.role == "band" and u.c == case.c and u.prompt_id == first["prompt_id"]]
    unit = next((u for u in bands if u.repeat == first.get("repeat")), bands[0])
    bodies, _, own, _ = band_rows(unit, manifest, body)
    return {"alone": body, "batch": bodies, "row": own[int(first["slot"])]}
