"""Writing a run directory: :func:`write_run` turns a run (one assembled from loose dumps, say) into the layout
:func:`analysis.read_run` reads, each request one line of ``captures/requests.jsonl`` in the capture envelope."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import polars as pl

from ..core import claim_output
from ..dumps import PAYLOAD_PARSERS, STREAM_FORMATS
from ..io import read_source_bytes
from ._formed import jsonable
from ._layout import RUN_VERSION, RunError
from ._model import Run

_PLACEMENT = ("prompt_id", "role", "c", "slot", "repeat")
CAPTURES = "captures/requests.jsonl"


def write_run(run: Run, path: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Write a run as a run directory: ``manifest.json`` and ``captures/requests.jsonl``.

    Each request becomes one line in the capture envelope, with its prompt, role, band, slot and
    repeat, and its payload as it was received: a stream's text as the ``sse`` string, a JSON
    response's own bytes as ``response`` (a one-line envelope cannot hold a line break: those of a
    pretty-printed response, which JSON allows only as whitespace, are dropped, and U+2028, U+2029
    and U+0085 in its strings written as escapes). An envelope's other keys (send time, arrival
    times, anything else) are kept. :func:`analysis.read_run` reads the directory back to the same
    frames, but for ``source``, ``record`` and ``raw_sha256``, which say where each request now lies.

    Parameters
    ----------
    run : Run
        The run, from :func:`analysis.assemble_run` or :func:`analysis.read_run`.
    path : path
        The run directory to write.
    force : bool
        Empty ``path`` first when it holds something (refused otherwise).

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    RunError
        A request whose payload has no capture-envelope form (a torch ``.pt`` file, a printed vLLM
        repr), named by its source.
    OutputExists
        ``path`` holds something and ``force`` is not given.

    Examples
    --------
    >>> import tempfile
    >>> from analysis import assemble_run, read_run, write_run
    >>> run = assemble_run([{"source": "tests/samples/vllm_chat_nonstream_token_ids__OpenPipe-ART.json",
    ...                      "prompt_id": "p0", "role": "reference", "slot": 0}])
    >>> folder = write_run(run, tempfile.mkdtemp() + "/run")
    >>> sorted(p.name for p in folder.iterdir())
    ['captures', 'manifest.json']
    >>> read_run(folder).dump.requests.select("prompt_id", "role", "slot", "completion_text").row(0)
    ('p0', 'reference', 0, 'Hello! How can I assist you today?')
    """
    lines, origins = _capture_lines(run)  # everything checked before anything is written
    path = claim_output(path, force=force, what="the run directory", folder=True)
    manifest = {**run.manifest, "run_version": RUN_VERSION}
    if run.path is None:
        manifest["assembled_from"] = origins
    (path / "captures").mkdir(parents=True, exist_ok=True)
    (path / CAPTURES).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    (path / "manifest.json").write_text(
        json.dumps(manifest, indent=2, ensure_ascii=False, default=jsonable) + "\n", encoding="utf-8"
    )
    return path


def _capture_lines(run: Run) -> tuple[list[str], list[dict[str, Any]]]:
    """One envelope line per request of the run (per source and record, in the dump's order), and where each came from."""
    requests = run.dump.requests
    requests = requests if isinstance(requests, pl.DataFrame) else pl.from_pandas(requests)
    records = requests.unique(["source", "record"], keep="first", maintain_order=True)
    texts: dict[str, str] = {}
    lines, origins = [], []
    for row in records.iter_rows(named=True):
        source, record = row["source"], row["record"]
        if source not in texts:
            texts[source] = _source_text(source)
        payload_kind, payload, envelope = _payload(texts[source], source, record, row["source_format"])
        placement = {k: row[k] for k in _PLACEMENT if row[k] is not None}
        # a legacy envelope's band_c is its placement's c, written again as c
        keys = {k: v for k, v in envelope.items() if k not in ("response", "sse", *_PLACEMENT, "band_c")}  # legacy key
        if "format" not in envelope:
            keys["format"] = row["source_format"]
        members = [
            f"{json.dumps(payload_kind)}: {payload}",
            *(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in {**placement, **keys}.items()),
        ]
        lines.append("{" + ", ".join(members) + "}")
        origins.append({"source": source, "record": record, "line": len(lines)})
    return lines, origins


def _source_text(source: str) -> str:
    try:
        raw = read_source_bytes(source)
    except OSError as exc:
        raise RunError(f"{source}: cannot read it again to copy its payload ({exc})") from None
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise RunError(
            f"{source}: not UTF-8 text: a capture envelope holds JSON or a stream's text, not this payload"
        ) from None


def _payload(text: str, source: str, record: int, fmt: str | None) -> tuple[str, str, dict[str, Any]]:
    """("response" | "sse", the value as JSON text, the envelope's other keys) of one record of a source."""
    if record == 0:  # a file holding one payload: its whole text
        return (*_value(text, source, fmt), {})
    line = _record_text(text, source, record)
    members = _members(line)
    if members is None or not {"response", "sse"} & members.keys():  # a bare payload on its line
        return (*_value(line, source, fmt), {})
    envelope = {key: json.loads(line[a:b]) for key, (a, b) in members.items() if key != "response"}
    if "response" in members:
        a, b = members["response"]
        return "response", _one_line(line[a:b]), envelope
    return "sse", json.dumps(envelope["sse"]), envelope


def _record_text(text: str, source: str, record: int) -> str:
    """The text of one record of a JSON-lines source, numbered as :func:`analysis.read_dumps` numbers them."""
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, dict):  # one pretty-printed envelope: the file is its single record
        return text
    lines = text.splitlines()
    if not 1 <= record <= len(lines):
        raise RunError(f"{source}: line {record}: not in the file any more; it changed since it was read")
    return lines[record - 1]


def _value(text: str, source: str, fmt: str | None) -> tuple[str, str]:
    if fmt in STREAM_FORMATS:
        return "sse", json.dumps(text)
    if fmt in PAYLOAD_PARSERS:
        return "response", _one_line(text.strip(" \t\r\n"))
    raise RunError(
        f"{source}: a {fmt} payload has no capture-envelope form (it holds a JSON response or a stream's text); "
        "a run directory cannot keep it as received"
    )


_SEPARATORS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}


def _one_line(json_text: str) -> str:
    """A JSON value's text on one line: its line breaks (whitespace in JSON) dropped, the other line separators
    (only ever inside its strings) escaped; everything else byte for byte."""
    text = json_text.replace("\r", "").replace("\n", "")
    return re.sub("[\u2028\u2029\x85]", lambda m: _SEPARATORS[m.group(0)], text)


_DECODER = json.JSONDecoder()
_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _skip_space(text: str, at: int) -> int:
    """Where the JSON whitespace starting at ``at`` ends (the pattern matches the empty string, so it always matches)."""
    match = _WHITESPACE.match(text, at)
    return match.end() if match is not None else at


def _members(text: str) -> dict[str, tuple[int, int]] | None:
    """Where each member's value of a JSON object lies in ``text`` (start, end), or None when ``text`` is no object."""
    at = _skip_space(text, 0)
    if text[at : at + 1] != "{":
        return None
    at = _skip_space(text, at + 1)
    spans: dict[str, tuple[int, int]] = {}
    if text[at : at + 1] == "}":
        return spans
    try:
        while True:
            key, at = _DECODER.raw_decode(text, at)
            at = _skip_space(text, at)
            if text[at : at + 1] != ":":
                return None
            start = _skip_space(text, at + 1)
            _, at = _DECODER.raw_decode(text, start)
            spans[key] = (start, at)
            at = _skip_space(text, at)
            if text[at : at + 1] == "}":
                return spans
            if text[at : at + 1] != ",":
                return None
            at = _skip_space(text, at + 1)
    except ValueError:
        return None
