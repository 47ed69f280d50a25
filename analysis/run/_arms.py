"""Control arms: the requests a run fires beside today's copies, so each divergence can be put on its cause.

A run probed with ``arms`` (``bia probe --arms repeat,copies,...``) holds, per prompt, its two m=1
references (fired cold, where the engine can skip its prompt cache per request: the m=1 baseline
is "alone, cold") and then, per repeat, the units of each arm named:

========  ==========================================================================================
arm       what it fires (each recorded request compared with ref #1 of its prompt)
========  ==========================================================================================
repeat    the request alone and cold, :data:`ARM_REPEATS` times: the run-to-run baseline
copies    today's layout: c copies of the prompt released together, for each c of the ladder
mixed     the prompt at a seeded position among c - 1 other prompts (vLLM's needle test)
prefix    per share of :data:`PREFIX_SHARES`, a primer sharing that much of the prompt's text with it,
          then the prompt alone (the primer is recorded as a filler)
cache     a primer of the same prompt (a filler), then the prompt alone on the warm cache
serial    the widest c of the ladder as requests one after another (to set against the copies
          band of that c, released together)
prefill   the reference's completion scored as a prompt: for each position j >= 1, the prompt with
          the first j completion tokens as the assistant's words, one token asked for; its logprob
          is set against ref #1's decode-time logprob at j (role ``prefill``, slot j)
========  ==========================================================================================

Every request carries its arm in its capture envelope; :func:`with_arm_column` reads it into the
requests' string column ``arm`` (references read as ``"reference"``). A run made before arms
existed reads as the arm ``copies``, or ``mixed`` when it was probed in the needle layout: the
needle among other prompts is what the mixed arm fires.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from ._manifest import ARM_NAMES
from ._unit import _DEFAULTS, Unit

ARMS = ARM_NAMES
ARM_REPEATS = 3  # the repeat arm's requests alone per repeat of the run
PREFIX_SHARES = (0.25, 0.5, 0.9)  # how much of the prompt's text each prefix primer shares with it
REFERENCE_ARM = "reference"  # the arm column of the m=1 references, which every arm shares
#: Each arm in a few words, for a judgement row named after it: a run without arms is one arm, named after its layout
#: (``copies``, ``mixed``), a name that alone does not say what was sent.
ARM_WORDS = {
    "repeat": "the prompt alone and cold, again",
    "copies": "every slot a copy of the prompt",
    "mixed": "the prompt among other prompts",
    "prefix": "the prompt after a primer sharing part of its text",
    "cache": "the prompt on a cache it warmed",
    "serial": "the widest c sent one after another",
    "prefill": "ref #1's completion scored as a prompt",
}


def arm_words(arm: str) -> str:
    """An arm as a judgement row names it for people: its name and what it sent.

    Parameters
    ----------
    arm : str
        An arm's name; a name that is not an arm's (``witness``) is returned as it is.

    Returns
    -------
    str

    Examples
    --------
    >>> arm_words("copies"), arm_words("witness")
    ('copies: every slot a copy of the prompt', 'witness')
    """
    return f"{arm}: {ARM_WORDS[arm]}" if arm in ARM_WORDS else arm


def legacy_arm(manifest: Mapping[str, Any]) -> str:
    """The arm a run made before arms reads as: ``mixed`` for a needle-layout run, else ``copies``.

    Parameters
    ----------
    manifest : Mapping of str to Any
        The run's manifest (``manifest.json``).

    Returns
    -------
    str

    Examples
    --------
    >>> legacy_arm({"requested": {"layout": "needle"}}), legacy_arm({})
    ('mixed', 'copies')
    """
    return "mixed" if (manifest.get("requested") or {}).get("layout") == "needle" else "copies"


def run_arms(manifest: Mapping[str, Any]) -> list[str]:
    """The arms a run holds: its manifest's ``arms``, or the one a run made before arms reads as.

    Parameters
    ----------
    manifest : Mapping of str to Any
        The run's manifest (``manifest.json``).

    Returns
    -------
    list of str

    Examples
    --------
    >>> run_arms({"arms": ["cache", "copies"]}), run_arms({})
    (['cache', 'copies'], ['copies'])
    """
    arms = manifest.get("arms")
    return list(arms) if arms is not None else [legacy_arm(manifest)]


def arm_plan(manifest: Mapping[str, Any]) -> list[Unit]:
    """The plan of a run probed with arms: per prompt the two cold m=1 references, then per repeat each arm's units
    in the order the manifest names the arms (the prefill arm once per prompt, in the first repeat).

    Parameters
    ----------
    manifest : Mapping of str to Any
        The run's manifest: ``arms``, ``prompts``, ``ladder``, ``repeats`` (1 by default), ``observer`` and
        ``sampler.max_tokens`` (the prefill arm's positions).

    Returns
    -------
    list of Unit

    Raises
    ------
    ValueError
        An arm name that is not one of ``ARMS``.

    Examples
    --------
    >>> manifest = {"ladder": [1, 2], "arms": ["repeat", "copies", "cache", "serial", "prefill"], "prompts": [{"prompt_id": "p0"}],
    ...             "sampler": {"max_tokens": 3}}
    >>> [u.key for u in arm_plan(manifest)]  # doctest: +NORMALIZE_WHITESPACE
    ['p0/reference/s0', 'p0/reference/s1', 'p0/repeat/band/c1/r0', 'p0/repeat/band/c1/r1', 'p0/repeat/band/c1/r2',
     'p0/band/c1/r0', 'p0/band/c2/r0', 'p0/cache/band/c1/r0', 'p0/serial/band/c2/r0', 'p0/prefill/r0']
    >>> arm_plan(manifest)[-1].slots  # the completion's positions 1 and 2, each scored as a prompt
    (1, 2)
    """
    ladder = list(manifest.get("ladder", _DEFAULTS["ladder"]))
    roles = ("band", "observer") if manifest.get("observer") else ("band",)
    max_tokens = int((manifest.get("sampler") or {}).get("max_tokens") or 1)
    units = []
    for prompt in manifest.get("prompts", []):
        pid = str(prompt.get("prompt_id"))
        units += [Unit(pid, "reference", None, 0, (slot,)) for slot in (0, 1)]
        for repeat in range(int(manifest.get("repeats", 1))):
            for arm in manifest["arms"]:
                units += _arm_units(arm, pid, repeat, ladder, roles, max_tokens)
    return units


def _arm_units(
    arm: str, pid: str, repeat: int, ladder: list[int], roles: tuple[str, ...], max_tokens: int
) -> list[Unit]:
    if arm == "repeat":
        return [Unit(pid, "band", 1, repeat * ARM_REPEATS + i, (0,), arm) for i in range(ARM_REPEATS)]
    if arm == "copies":
        return [Unit(pid, role, c, repeat, tuple(range(c)), arm) for c in ladder for role in roles]
    if arm == "mixed":
        return [Unit(pid, role, c, repeat, (0,), arm) for c in ladder for role in roles]
    if arm == "prefix":
        return [Unit(pid, "band", 1, repeat * len(PREFIX_SHARES) + i, (0,), arm) for i in range(len(PREFIX_SHARES))]
    if arm == "cache":
        return [Unit(pid, "band", 1, repeat, (0,), arm)]
    if arm == "serial":
        return [Unit(pid, "band", max(ladder), repeat, tuple(range(max(ladder))), arm)]
    if arm == "prefill":
        return [Unit(pid, "prefill", None, 0, tuple(range(1, max_tokens)), arm)] if repeat == 0 else []
    raise ValueError(f"arm must be one of {', '.join(ARMS)}, got {arm!r}")


def arm_expression(manifest: Mapping[str, Any]) -> pl.Expr:
    """The ``arm`` of each request: its capture envelope's, else ``reference`` for an m=1 reference, else the run's legacy arm.

    Parameters
    ----------
    manifest : Mapping of str to Any or None
        The run's manifest; None reads no envelope (every request is a reference or ``copies``).

    Returns
    -------
    polars.Expr
        A string expression named ``arm`` over the requests' ``role`` and ``extra`` columns.
    """
    named = pl.col("extra").str.json_path_match("$.arm") if manifest is not None else pl.lit(None, pl.String)
    fallback = (
        pl.when(pl.col("role") == "reference").then(pl.lit(REFERENCE_ARM)).otherwise(pl.lit(legacy_arm(manifest or {})))
    )
    return pl.coalesce(named, fallback).cast(pl.String).alias("arm")


def with_arm_column(requests: Any, manifest: Mapping[str, Any]) -> Any:
    """The requests frame (polars or pandas) with its string column ``arm`` (see the module docstring).

    Parameters
    ----------
    requests : polars.DataFrame or pandas.DataFrame
        The requests, with ``role`` and ``extra`` (the capture envelope as JSON); a frame without either is
        returned as it is.
    manifest : Mapping of str to Any
        The run's manifest (``manifest.json``).

    Returns
    -------
    polars.DataFrame or pandas.DataFrame
        A new frame of the same kind.

    Examples
    --------
    >>> requests = pl.DataFrame({"role": ["reference", "band", "band"], "extra": [None, '{"arm": "cache"}', None]})
    >>> with_arm_column(requests, {"arms": ["cache"]})["arm"].to_list()
    ['reference', 'cache', 'copies']
    """
    if isinstance(requests, pl.DataFrame):
        if "extra" not in requests.columns or "role" not in requests.columns:
            return requests
        return requests.with_columns(arm_expression(manifest))
    if "extra" not in requests.columns or "role" not in requests.columns:
        return requests
    arms = pl.from_pandas(requests[["role", "extra"]]).select(arm_expression(manifest))["arm"]
    out = requests.copy()
    out["arm"] = arms.to_pandas().to_numpy()
    return out


def main_arm(manifest: Mapping[str, Any]) -> str:
    """The arm whose bands stand for the run where one layout is wanted (S7, Std@Acc, the witness): ``copies``
    when the run holds it, else its first arm.

    Parameters
    ----------
    manifest : Mapping of str to Any
        The run's manifest (``manifest.json``).

    Returns
    -------
    str

    Examples
    --------
    >>> main_arm({"arms": ["cache", "mixed"]}), main_arm({"arms": ["mixed", "copies"]}), main_arm({"requested": {"layout": "needle"}})
    ('cache', 'copies', 'mixed')
    """
    arms = run_arms(manifest)
    return "copies" if "copies" in arms else arms[0]
