"""``repro.py``: the standalone script a repro writes (Python's standard library only), its case set in as a literal."""

from __future__ import annotations

import json
import pprint
from collections.abc import Mapping
from typing import Any

# The script's body: it reads CASE (set above it) and nothing of bia. Kept as text here, so the script a user runs is exactly
# what a test runs.
_BODY = r'''
import argparse
import json
import os
import struct
import sys
import threading
import urllib.error
import urllib.request
import uuid


def send(url, body, timeout, key):
    """One streamed chat completion: each token's (text, logprob) in order."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    steps = []
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for raw in response:
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line.startswith("data:"):
                continue
            data = line[5:].lstrip(" ")
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"the server answered an error event: {chunk['error']}")
            for choice in chunk.get("choices") or []:
                for entry in (choice.get("logprobs") or {}).get("content") or []:
                    candidates = [(c.get("token"), c.get("logprob")) for c in entry.get("top_logprobs") or []]
                    steps.append(((entry.get("token"), entry.get("logprob")), candidates))
    if not steps:
        raise RuntimeError("the answer held no token with a logprob")
    return steps


def send_together(url, bodies, timeout, key):
    """The batch: every row sent at once (the threads wait for each other first), each row's tokens back in row order."""
    results, errors = [None] * len(bodies), []
    gate = threading.Barrier(len(bodies))

    def one(row):
        gate.wait()
        try:
            results[row] = send(url, bodies[row], timeout, key)
        except Exception as exc:  # said by the caller, with the row
            errors.append(f"row {row}: {exc}")

    threads = [threading.Thread(target=one, args=(row,)) for row in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    return results


def bits(value):
    """The logprob's bits at the precision the run recorded (float32 by default), as hex."""
    if value is None:
        return "none"
    return struct.pack(">d" if CASE["precision"] == "float64" else ">f", value).hex()


def first_difference(alone, other):
    """Where ``other`` first parts from ``alone``: (token, candidate) with candidate None for the chosen token, else the
    rank of the first top-logprob candidate whose text or logprob differs (as bia compares them: the values as sent);
    None when nothing parts."""
    for position, (a, b) in enumerate(zip(alone, other)):
        if a[0] != b[0]:
            return position, None
        for rank, (x, y) in enumerate(zip(a[1], b[1])):
            if x != y:
                return position, rank
        if len(a[1]) != len(b[1]):
            return position, min(len(a[1]), len(b[1]))
    return None if len(alone) == len(other) else (min(len(alone), len(other)), None)


def show(where, alone, other, label):
    position, rank = where

    def side(steps):
        if position >= len(steps):
            return "(ended)"
        chosen, candidates = steps[position]
        if rank is not None and rank >= len(candidates):
            return "(no such candidate)"
        token, logprob = chosen if rank is None else candidates[rank]
        return f"{token!r} logprob {logprob!r} bits 0x{bits(logprob)}"

    what = "the chosen token" if rank is None else f"top_logprobs candidate {rank}"
    print(f"token {position}, {what}: alone {side(alone)}")
    print(f"token {position}, {what}: {label} {side(other)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=CASE["url"], help="the chat endpoint (default: the server the part was found on)")
    parser.add_argument("--tries", type=int, default=CASE["tries"], help="how many times to try; any part is a part")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds each request may take")
    args = parser.parse_args()
    if not args.url:
        parser.error("the run was not made against a server: give --url")
    url = args.url.rstrip("/")
    if not url.endswith("/chat/completions"):
        url += "/v1/chat/completions"
    key = os.environ.get("BIA_API_KEY")
    try:
        for attempt in range(1, args.tries + 1):
            # alone-only with cold fields: the first send skips the cache (a full prefill), the second warms it with this
            # very prompt, the third is compared: the cache the server keeps by default serves it, or, with the cache off,
            # it is a full prefill again and matches
            cold = {k: uuid.uuid4().hex if v == "{salt}" else v for k, v in CASE.get("cold", {}).items()}
            alone = send(url, {**CASE["alone"], **cold}, args.timeout, key)
            if CASE["batch"]:
                other = send_together(url, CASE["batch"], args.timeout, key)[CASE["row"]]
                label = f"batched (row {CASE['row']} of {len(CASE['batch'])})"
            else:
                if cold:
                    send(url, CASE["alone"], args.timeout, key)
                other = send(url, CASE["alone"], args.timeout, key)
                label = "on the warm cache" if cold else "alone again"
            where = first_difference(alone, other)
            if where is not None:
                first = "the one sent cold" if cold else "the one sent alone"
                print(f"PARTS (try {attempt} of {args.tries}): the request {label.split(' (')[0]} parts from {first}")
                show(where, alone, other, label)
                return 1
        what = "batched request" if CASE["batch"] else "request sent again" if CASE.get("cold") else "repeat"
        print(f"no part in {args.tries} tries: the {what} matches the one sent {'cold' if CASE.get('cold') else 'alone'}, "
              f"token for token and bit for bit ({len(alone)} tokens)")
        return 0
    except (OSError, urllib.error.URLError, RuntimeError, ValueError) as exc:
        print(f"error: {url}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
'''


def script_text(case: Mapping[str, Any], *, title: str) -> str:
    """``repro.py``'s text: a docstring, ``CASE`` (the URL, the bodies, the row, the tries, the precision) as a Python literal,
    and the script's body. Exit 1 when the request still parts, 0 when it does not, 2 when the server gives no answer.

    Parameters
    ----------
    case : mapping
        ``url``, ``alone`` (a request body), ``batch`` (the batch's bodies; empty for an alone-only repro), ``row``, ``tries``
        and ``precision`` (``float32`` or ``float64``); alone-only, ``cold`` (fields the first send carries to skip the
        prompt cache; then the request is sent twice more and the last compared).
    title : str
        The docstring's first line.

    Returns
    -------
    str

    Examples
    --------
    >>> text = script_text({"url": "http://h/v1/chat/completions", "alone": {}, "batch": [], "row": None, "tries": 3,
    ...                     "precision": "float32"}, title="a repro")
    >>> compile(text, "repro.py", "exec") is not None, text.splitlines()[1][3:]
    (True, 'a repro')
    """
    cold = case.get("cold")
    how = (
        "in its batch"
        if case["batch"]
        else f"twice more as the server takes it by default (the first send with {json.dumps(cold)}: its whole prompt\n"
        "evaluated; the second warms the prompt cache with it; the third, compared with the first, is served from it)"
        if cold
        else "alone again"
    )
    doc = (
        f'"""{title}\n\nSends the request alone and {how}, and prints the first '
        "token where the two part, with both logprobs and their bits.\nExit 1: it still parts; 0: it does not; 2: no answer. "
        "Python's standard library only: python3 repro.py [--url URL] [--tries N]\n(a bearer token, when the server needs one, "
        'from BIA_API_KEY).\n"""\n'
    )
    literal = pprint.pformat(dict(case), width=120, sort_dicts=False)
    return f"#!/usr/bin/env python3\n{doc}\nCASE = {literal}\n{_BODY}"
