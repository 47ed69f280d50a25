"""Runs for the evidence rules (issue 40, "a verdict is never greener than its evidence"): a toy ``generate`` probed in
process by :func:`analysis.probe_callable`, then its captures (``captures/requests.jsonl``, one capture envelope a line)
and its ``manifest.json`` edited the way a broken server or a hand-edited run would leave them.

``tests/test_evidence_rules.py`` (one worked example per case of the issue) and ``tests/test_judgement_relations.py``
(metamorphic relations over generated runs) share these helpers."""

from __future__ import annotations

import json
import math
import shutil
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from analysis import judge, probe_callable, read_run

WORDS = ("Hello", "World", "Paris", "Lyon", "Berlin", "Rome", "Madrid", "Oslo", "Vienna", "Prague", "Dublin", "Lisbon")
TOKENS = 3  # completion tokens a toy answers with
# The numbers every surface counts, compared by the relations (``contexts`` is the column issue 40 adds beside ``requests``).
COUNTS = ("requests", "contexts", "divergent", "tokens_parted", "bits_only", "bits_unknown", "alone", "alone_parted", "bands",
          "bands_unformed", "missing", "cs_missing", "upper_bound", "requests_needed")


def toy(*, tokens: int = TOKENS, empty: Callable[[str], bool] = lambda prompt: False, shift: float = 0.0, alternative_shift: float = 0.0,
        logprob: Callable[[int], float] | None = None) -> Callable[[list[str]], list[dict[str, Any]]]:
    """A greedy toy engine: each prompt's answer is ``tokens`` token ids of its own (the first from its text), each with a
    logprob and two top alternatives. In a batch (more than one prompt) the chosen logprobs move by ``shift`` and the second
    alternative's by ``alternative_shift``; a prompt for which ``empty`` is true gets an empty answer."""
    chosen = logprob or (lambda k: -0.5 / 2**k)

    def generate(prompts: list[str]) -> list[dict[str, Any]]:
        batched = len(prompts) > 1
        out = []
        for prompt in prompts:
            if empty(prompt):
                out.append({"token_ids": [], "logprobs": [], "top_logprobs": []})
                continue
            ids = [10 + sum(map(ord, prompt)) % 50] + [100 + k for k in range(1, tokens)]
            lps = [chosen(k) + (shift if batched else 0.0) for k in range(tokens)]
            tops = [[(t, lp), (7, -4.0 - k + (alternative_shift if batched else 0.0))] for k, (t, lp) in enumerate(zip(ids, lps))]
            out.append({"token_ids": ids, "logprobs": lps, "top_logprobs": tops})
        return out

    return generate


def probe(folder: Path, generate=None, *, prompts: int | Sequence[str] = 2, ladder: Sequence[int] = (1, 2),
          repeats: int = 1, **options: Any) -> Path:
    """``generate`` (a :func:`toy` by default) probed into ``folder``: the run directory."""
    texts = list(WORDS[:prompts]) if isinstance(prompts, int) else list(prompts)
    probe_callable(generate or toy(), texts, folder, ladder=list(ladder), repeats=repeats, progress=False, **options)
    return folder


def copy_run(source: Path, folder: Path) -> Path:
    """A copy of a run directory, without its derived tables (rebuilt from the captures when read)."""
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("derived"))
    return folder


def lines(run: Path) -> list[dict[str, Any]]:
    """The run's capture envelopes, in file order."""
    text = (run / "captures" / "requests.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def write_lines(run: Path, envelopes: Sequence[dict[str, Any]]) -> None:
    """Replace the run's captures (NaN and infinities written as JSON's NaN, Infinity, -Infinity, as Python writes them)."""
    (run / "captures" / "requests.jsonl").write_text("".join(json.dumps(e) + "\n" for e in envelopes), encoding="utf-8")
    shutil.rmtree(run / "derived", ignore_errors=True)


def manifest(run: Path) -> dict[str, Any]:
    return json.loads((run / "manifest.json").read_text(encoding="utf-8"))


def write_manifest(run: Path, data: dict[str, Any]) -> None:
    (run / "manifest.json").write_text(json.dumps(data, indent=2), encoding="utf-8")


def where(envelope: dict[str, Any]) -> tuple:
    """A capture's place: (prompt_id, role, c, slot, repeat)."""
    return (envelope.get("prompt_id"), envelope.get("role"), envelope.get("c"), envelope.get("slot"), envelope.get("repeat"))


def is_batched(envelope: dict[str, Any]) -> bool:
    return envelope.get("role") == "band" and (envelope.get("c") or 0) > 1


def is_reference(envelope: dict[str, Any], slot: int | None = None) -> bool:
    return envelope.get("role") == "reference" and (slot is None or envelope.get("slot") == slot)


def entries(envelope: dict[str, Any]) -> list[dict[str, Any]]:
    """A captured chat completion's logprob entries (one per token), edited in place by the callers."""
    logprobs = envelope["response"]["choices"][0]["logprobs"]
    return [] if logprobs is None else logprobs["content"]


def empty_completion(envelope: dict[str, Any]) -> None:
    """The response of a server that ended the stream at once: no token, no logprob, no text, 0 completion tokens."""
    response = envelope["response"]
    response["choices"][0]["logprobs"] = {"content": []}
    response["choices"][0]["message"]["content"] = ""
    response["choices"][0]["finish_reason"] = "stop"
    response["usage"]["completion_tokens"] = 0
    response.get("timings", {}).update(predicted_n=0, predicted_per_second=None)


def flip_bit(value: float, bit: int) -> float:
    """``value`` with bit ``bit`` of its float64 representation flipped (0 is the last bit of the mantissa)."""
    (bits,) = struct.unpack("<Q", struct.pack("<d", value))
    (out,) = struct.unpack("<d", struct.pack("<Q", bits ^ (1 << bit)))
    assert math.isfinite(out) and out != value
    return out


def refuse(run: Path, chosen: Callable[[dict[str, Any]], bool], reason: str = "HTTP 503: server refused the request") -> int:
    """Take the captures ``chosen`` picks out of the run and list them under the manifest's ``refused``, as ``bia probe``
    does with a request the server refused; how many."""
    kept, gone = [], []
    for envelope in lines(run):
        (gone if chosen(envelope) else kept).append(envelope)
    write_lines(run, kept)
    data = manifest(run)
    data.setdefault("refused", []).extend(
        {k: e[k] for k in ("unit", "prompt_id", "role", "c", "slot", "repeat") if k in e} | {"reason": reason} for e in gone)
    write_manifest(run, data)
    return len(gone)


def as_stream(envelope: dict[str, Any], mode: str | None, times: Sequence[float]) -> dict[str, Any]:
    """A captured chat completion turned into the SSE stream a server would have sent, each chunk declaring
    ``stream_mode`` ``mode`` (None: none), with the content chunks' arrival ``times`` (the role chunk arrives with the first,
    the finish and [DONE] with the last)."""
    response = envelope["response"]
    base = {"id": response["id"], "object": "chat.completion.chunk", "model": response["model"]} | ({"stream_mode": mode} if mode else {})
    chunks = [base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}]}]
    for entry in entries(envelope):
        chunks.append(base | {"choices": [{"index": 0, "delta": {"content": entry["token"]}, "logprobs": {"content": [entry]},
                                          "finish_reason": None}]})
    chunks.append(base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "usage": response.get("usage")})
    sse = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    arrival = [times[0], *times, times[-1], times[-1]]
    out = {k: v for k, v in envelope.items() if k != "response"}
    return out | {"sse": sse, "arrival_times": list(arrival), "sent_at_s": 0.0}


def row(run: Path, *, target_rate: float = 0.01) -> dict[str, Any]:
    """The judgement's one row of a run with one arm."""
    judgement = judge(read_run(run), target_rate=target_rate)
    assert len(judgement) == 1, judgement.frame
    return judgement.frame.row(0, named=True)


def counts(r: dict[str, Any]) -> dict[str, Any]:
    """A row's verdict and numbers (``contexts`` None where the judgement has no such column yet)."""
    return {"verdict": r["verdict"]} | {k: r.get(k) for k in COUNTS}


def unknown_logprob(entry: dict[str, Any], value: float | None) -> None:
    """A token's logprob made ``value`` (None, NaN or an infinity): the chosen one, and the same token's among its top
    alternatives, which carry the same number."""
    for top in entry.get("top_logprobs") or []:
        if top.get("token") == entry.get("token"):
            top["logprob"] = value
    entry["logprob"] = value
