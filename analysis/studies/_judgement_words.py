"""A judgement row in words: the band and the first request that parts as people name them, the reason for each
verdict, the evidence line and a rate in percent."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _where(request: Mapping[str, Any]) -> str:
    """A band as people name it: its prompt, c and repeat (an assembled run's bands have no repeat)."""
    repeat = f" repeat {request['repeat']}" if request.get("repeat") is not None else ""
    return f"{request['prompt_id']} c={request['c']}{repeat}"


def _first_words(first: Mapping[str, Any]) -> str:
    """The first request that parts, in words: which, and how."""
    ulp = f" (up to {first['max_ulp']:,} ULP)" if first.get("max_ulp") else ""
    how = (
        f"its tokens part at token {first['position']}"
        if first["tokens_parted"]
        else f"its logprob bits differ from ref #1 from token {first['position']}{ulp}"
    )
    if first["role"] == "ref #2":
        return f"{first['prompt_id']} ref #2, sent alone: {how}"
    if first["c"] == 1 or first["role"].startswith("serial "):  # the serial arm sends the widest c one at a time: alone
        arm = first["role"].split(" ")[0]
        return f"{first['prompt_id']} sent alone ({arm} c={first['c']}{_repeat(first)} slot {first['slot']}): {how}"
    return f"{_where(first)} slot {first['slot']}: {how}"


def _repeat(first: Mapping[str, Any]) -> str:
    return f" repeat {first['repeat']}" if first.get("repeat") is not None else ""


def _alone_reason(row: dict[str, Any], first: Mapping[str, Any]) -> str:
    what = "its prompt cache" if row["cause"] == "prompt cache" else "run to run"
    return (
        f"not reproducible alone ({what}): {row['alone_parted']} of {row['alone']} requests sent alone part from ref #1 of their "
        f"prompt, the first {_first_words(first)}; batching is not judged until the server repeats itself alone"
    )


def _red_reason(row: dict[str, Any], first: Mapping[str, Any]) -> str:
    return (
        f"{row['divergent']} of {row['requests']} batched requests part from m=1 ({row['tokens_parted']} in tokens, "
        f"{row['bits_only']} only in bits); the first is {_first_words(first)}"
    )


def _counted(row: dict[str, Any]) -> str:
    """The batched requests and what the bound counts of them: distinct batch contexts, and the prompts they hold."""
    n, contexts, prompts = row["requests"], row["contexts"], row["prompts"]
    if contexts == n:
        return f"{n} batched requests"
    return (
        f"{n} batched requests ({contexts} distinct batch context{'s' if contexts != 1 else ''} "
        f"of {prompts} prompt{'s' if prompts != 1 else ''})"
    )


def _bound_reason(row: dict[str, Any], green: bool) -> str:
    n, needed, target = row["contexts"], row["requests_needed"], rate_words(row["target_rate"])
    head = (
        f"0 of {_counted(row)} part from m=1, every band seen formed; the {row['confidence']:.0%} upper bound on the "
        f"divergence rate is {rate_words(row['upper_bound'])}, "
    )
    if green:
        return head + f"below the {target} target"
    unit = "batched requests" if n == row["requests"] else "distinct batch contexts"
    return head + f"not below the {target} target: {needed} {unit} would do ({needed - n} more)"


def _evidence(row: dict[str, Any]) -> str:
    formed = row["bands"] - row["bands_unformed"]
    bound = (
        f"; bound {rate_words(row['upper_bound'])} at {row['confidence']:.0%}" if row["upper_bound"] is not None else ""
    )
    alone = f"; alone: {row['alone'] - row['alone_parted']} of {row['alone']} match ref #1"
    return (
        f"{_counted(row)}, {formed} of {row['bands']} bands seen formed{bound} ({row['requests_needed']} needed){alone}"
    )


def rate_words(value: float) -> str:
    """A rate in percent, with the digits a reader needs to see it against a target (0.997%, not 1%).

    Parameters
    ----------
    value : float
        A rate, as a fraction (0.01 for 1%).

    Returns
    -------
    str
    """
    return f"{value * 100:.3g}%"
