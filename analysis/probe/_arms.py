"""How the probe fires each control arm (see :mod:`analysis.run._arms` for what each arm is): which arms an
engine can run, the fields that make a request cold, the prefill arm's request, and the prefix arm's primers.

Arms an engine cannot run are refused before anything is fired: the cache arm needs a way to make one
request skip the prompt cache (the engine profile's ``cold``), the prefill arm a way to put the first j
completion tokens into the prompt (its ``prefill``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, cast

from ..run import ARMS, PREFIX_SHARES
from ._engines import EngineProfile
from ._rundir import ProbeError

PRIMER_TAIL = (
    " Now write about something else entirely."  # what makes a prefix primer part from the prompt after its shared text
)


def check_arms(arms: Sequence[str] | None, profile: EngineProfile | None = None, layout: str = "copies") -> None:
    """Refuse arms that are unknown, named twice, or that the engine cannot run, before anything is fired.

    Parameters
    ----------
    arms : sequence of str, optional
        The control arms to fire (names from ``analysis.run.ARMS``); None fires none, and nothing is checked.
    profile : EngineProfile, optional
        The engine the arms would run on; without it only the names and the layout are checked.
    layout : str, default "copies"
        The run's layout: arms replace it, so any other than ``copies`` is refused with them.

    Raises
    ------
    ProbeError
        An arm that is unknown or named twice, arms given with another layout, or an arm the engine cannot run.

    Examples
    --------
    >>> from analysis.probe import PROFILES
    >>> check_arms(["copies", "cache"], PROFILES["llamacpp"])
    >>> check_arms(["prefill"], PROFILES["sglang"])
    Traceback (most recent call last):
    ...
    analysis.ProbeError: the prefill arm cannot run on SGLang: ...
    """
    if arms is None:
        return
    if isinstance(arms, str) or not arms or not all(isinstance(a, str) for a in arms):
        raise ProbeError(f"arms must be a list of one or more of {', '.join(ARMS)}, got {arms!r}")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ProbeError(f"unknown arm {unknown[0]!r}: arms are {', '.join(ARMS)}")
    if len(set(arms)) != len(arms):
        raise ProbeError(f"arms names an arm twice: {list(arms)}")
    if layout != "copies":
        raise ProbeError(
            "arms replace the layout: "
            + ("the needle layout is the mixed arm; " if layout == "needle" else f"the {layout} layout has no arm; ")
            + "give arms or a layout, not both"
        )
    if profile is None:
        return
    if "cache" in arms and profile.cold is None:
        raise ProbeError(
            f"the cache arm cannot run on {profile.label}: bia knows no field that makes one of its requests skip the prompt "
            "cache, so no request can be known cold; leave the cache arm out (or give --engine if the engine was misread)"
        )
    if "prefill" in arms and profile.prefill is None:
        why = (
            "its prompt logprobs (logprob_start_len) are on its native /generate, which bia probe does not speak"
            if profile.name == "sglang"
            else "bia knows no way to put completion tokens into its prompt and score them"
        )
        raise ProbeError(f"the prefill arm cannot run on {profile.label}: {why}; leave the prefill arm out")


def cold_fields(profile: EngineProfile) -> dict[str, Any]:
    """The fields that make one request skip the engine's prompt cache; ``{}`` where it has none or takes none.

    Parameters
    ----------
    profile : EngineProfile
        The engine; its ``cold`` fields are sent, with each ``"{salt}"`` value made a fresh random salt.

    Returns
    -------
    dict of str to object

    Examples
    --------
    >>> from analysis.probe import PROFILES
    >>> cold_fields(PROFILES["llamacpp"])
    {'cache_prompt': False}
    >>> len(cold_fields(PROFILES["vllm"])["cache_salt"])  # a salt of its own, so no cached block is shared
    32
    """
    return {key: (uuid.uuid4().hex if value == "{salt}" else value) for key, value in (profile.cold or {}).items()}


def prefill_body(body: dict[str, Any], prompt: str, completion: str, profile: EngineProfile) -> dict[str, Any]:
    """A request asking for the one token after the prompt and ``completion`` (the reference's first j tokens), cold.

    Parameters
    ----------
    body : dict of str to object
        The prompt's ordinary request body, whose other fields are kept.
    prompt : str
        The prompt's text.
    completion : str
        The text of the reference's first j completion tokens.
    profile : EngineProfile
        The engine: its ``prefill`` says how the completion is put into the prompt (``concat``, ``continue`` or an
        assistant message), its ``cold`` how the request skips the prompt cache.

    Returns
    -------
    dict of str to object

    Examples
    --------
    >>> from analysis.probe import PROFILES
    >>> base = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    >>> prefill_body(base, "Hi", " there", PROFILES["llamacpp"])["messages"]
    [{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': ' there'}]
    >>> body = prefill_body(base, "Hi", " there", PROFILES["bia"])
    >>> body["messages"], body["max_tokens"]
    ([{'role': 'user', 'content': 'Hi there'}], 1)
    """
    out = {**body, "max_tokens": 1, **cold_fields(profile)}
    if profile.prefill == "concat":
        out["messages"] = [{"role": "user", "content": prompt + completion}]
    else:
        out["messages"] = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
    if profile.prefill == "continue":
        out.update(continue_final_message=True, add_generation_prompt=False)
    return out


def completion_prefix(pieces: list[bytes | None], j: int) -> tuple[str | None, str | None]:
    """The text of the first ``j`` completion tokens, or None and why it cannot be sent as a message.

    Parameters
    ----------
    pieces : list of bytes or None
        The reference's completion tokens, as bytes (None where a token has neither bytes nor text).
    j : int
        How many of the first tokens to join.

    Returns
    -------
    text : str or None
        The first ``j`` tokens as text, or None when they cannot be sent.
    why : str or None
        Why they cannot, or None when they can.

    Examples
    --------
    >>> completion_prefix([b"a", b"b"], 1), completion_prefix([b"a"], 3)[1]
    (('a', None), 'the reference has 1 tokens, fewer than 3')
    >>> completion_prefix([b"\\xe2", b"\\x82"], 1)[1]
    "the first 1 tokens' bytes are not whole UTF-8 text: no chat message can hold them"
    """
    if j > len(pieces):
        return None, f"the reference has {len(pieces)} tokens, fewer than {j}"
    if any(piece is None for piece in pieces[:j]):
        return None, f"a token among the first {j} has neither bytes nor text"
    try:
        return b"".join(cast("list[bytes]", pieces[:j])).decode("utf-8"), None  # no None among them: checked above
    except UnicodeDecodeError:
        return None, f"the first {j} tokens' bytes are not whole UTF-8 text: no chat message can hold them"


def prefix_primer(text: str, index: int) -> str:
    """The prefix arm's primer for its ``index``-th share: the prompt's first share of characters, then other words.

    Parameters
    ----------
    text : str
        The prompt's text.
    index : int
        Which share of ``analysis.run.PREFIX_SHARES`` (taken modulo their number) the primer shares with the prompt.

    Returns
    -------
    str

    Examples
    --------
    >>> prefix_primer("abcdefgh", 1)
    'abcd Now write about something else entirely.'
    """
    share = PREFIX_SHARES[index % len(PREFIX_SHARES)]
    return text[: max(1, int(len(text) * share))] + PRIMER_TAIL
