"""The run directory as the probe writes it: the manifest (atomically), captures, partial streams,
refusals, and what a resume sets aside."""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import orjson

from ..dumps import LIVE_SPAN
from ..run import Unit


class ProbeError(ValueError):
    """A probe that cannot start or resume; the message names the run directory and the setting."""


class NoRunToResume(ProbeError):
    """``resume`` given a folder that holds no run: a path with nothing to read (bia's exit 3)."""


class RunUnreadable(ProbeError):
    """``resume`` given a run whose manifest cannot be read: a malformed run (bia's exit 4)."""


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


class _RunWriter:
    """The run directory as the probe fills it: manifest, captures, partial streams, refusals."""

    def __init__(self, folder: Path, manifest: dict[str, Any]) -> None:
        self.folder, self.manifest = folder, manifest
        self.origin = time.monotonic()  # captures' sent_at_s count from here (this session, when a run is resumed)
        self.cache_metrics: tuple[str, ...] = ()  # set by the probe from the engine profile when /metrics answers
        self.engine_metrics: dict[str, str] = {}  # role -> the engine's counter, likewise
        self.reference_tokens: dict[str, tuple] = {}  # unit key -> token identities of the references kept this session
        self.reference_pieces: dict[
            str, list
        ] = {}  # prompt id -> ref #1's completion tokens as bytes, for the prefill arm
        for sub in ("captures", "partial"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        self.save()
        self.captures_path = folder / "captures" / "requests.jsonl"
        self.captures = self.captures_path.open("ab")

    def save(self) -> None:
        """Rewrite the manifest atomically: a kill mid-write leaves the old one whole."""
        temporary = self.folder / "manifest.json.tmp"
        temporary.write_text(json.dumps(self.manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(temporary, self.folder / "manifest.json")

    def partial(self, unit: Unit, slot: int, role: str) -> Path:
        name = unit.capture_name(slot) if role != "filler" else f"{unit.key.replace('/', '.')}.filler{slot}"
        return self.folder / "partial" / f"{name}.sse"

    def keep(self, result: dict[str, Any], partial: Path, **where: Any) -> dict[str, Any] | None:
        """One finished request: into captures, or listed as refused with its bytes kept (a stream's ``sse``, an HTTP error's ``body``).

        A whole stream is parsed once by the dump reader before it is kept (after the band, so the
        arrival times are not slowed): a malformed event refuses the request instead of making the
        run unreadable. Returns the refusal (the result with its reason), or None when kept.
        """
        return self.commit(self.prepare(result, **where), partial)

    def prepare(self, result: dict[str, Any], **where: Any) -> dict[str, Any]:
        """A finished request parsed and its capture line made, not yet written (:meth:`commit` writes it): a band fired
        again keeps only one attempt. ``window`` is its stream's live window (None when it shows none)."""
        line, window, rows = b"", None, None
        if "error" not in result:
            line = orjson.dumps({**result, **where})  # orjson: a 1 MB stream's envelope in a millisecond
            rows, problem = _parse_capture(line, self.captures_path)
            if problem:
                result = {"error": problem, "sse": result["sse"]}
            else:
                window = _live_window(rows, result.get("sent_at_s"))
        return {"result": result, "where": where, "line": line, "window": window, "rows": rows}

    def commit(self, prepared: dict[str, Any], partial: Path) -> dict[str, Any] | None:
        """Write a request :meth:`prepare` made ready: into captures, or listed as refused. Returns the refusal, or None."""
        result, where, rows = prepared["result"], prepared["where"], prepared["rows"]
        if "error" not in result:
            if where.get("role") == "reference":  # kept for aprender's reference rule, so it is not parsed again
                self.reference_tokens[where["unit"]] = _identities(rows)
                if where.get("slot") == 0:
                    self.reference_pieces[where["prompt_id"]] = _pieces(rows)
            self.captures.write(prepared["line"] + b"\n")
            self.captures.flush()
        else:
            self.manifest["refused"].append({**where, "reason": result["error"]})
            if result.get("sse") or result.get("body"):
                with (self.folder / "refused.jsonl").open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps({**where, **result}, ensure_ascii=False) + "\n")
        _drop_partial(partial)  # only once its bytes are kept elsewhere
        return result if "error" in result else None

    def reference_agreement(self, prompt_id: str) -> int | None:
        """How many leading tokens a prompt's two kept m=1 references share; None unless both were kept.

        A reference kept before a resume is read back from the captures, the others were noted by :meth:`keep`.
        """
        from ..metrics import parity

        keys = [f"{prompt_id}/reference/s{slot}" for slot in (0, 1)]
        wanted = {
            f'"unit":"{key}"'.encode(): key for key in keys if key not in self.reference_tokens
        }  # as orjson writes the envelope
        if wanted:
            self.captures.flush()
            with self.captures_path.open("rb") as handle:
                for line in handle:
                    for marker, key in wanted.items():
                        if marker in line:
                            self.reference_tokens[key] = _identities(_parse_capture(line, self.captures_path)[0])
        if not all(key in self.reference_tokens for key in keys):
            return None
        return parity.agreement(self.reference_tokens[keys[0]], self.reference_tokens[keys[1]])

    def pieces(self, prompt_id: str) -> list | None:
        """Ref #1's completion tokens as bytes (the prefill arm's prefixes): kept this session, or read back from the captures."""
        if prompt_id not in self.reference_pieces:
            marker = f'"unit":"{prompt_id}/reference/s0"'.encode()
            self.captures.flush()
            with self.captures_path.open("rb") as handle:
                for line in handle:
                    if marker in line:
                        self.reference_pieces[prompt_id] = _pieces(_parse_capture(line, self.captures_path)[0])
        return self.reference_pieces.get(prompt_id)

    def close(self) -> None:
        self.captures.close()


def _drop_partial(partial: Path) -> None:
    """Remove a request's partial capture (raw bytes and event times) once it is kept, refused or never answered."""
    partial.unlink(missing_ok=True)
    partial.with_suffix(".times").unlink(missing_ok=True)


def _parse_capture(line: bytes, source: Path):
    """A capture envelope parsed by the dump reader: (its rows, None), or (None, why it cannot be read; the
    reader's error names the record and field)."""
    from ..dumps import DumpError, parse_source

    try:
        return parse_source(line, str(source))[0], None
    except DumpError as exc:
        return None, f"the stream does not parse: {exc}"


def _live_window(rows, sent_at: float | None) -> tuple[float, float] | None:
    """When a parsed capture's first and last content chunks arrived, on the run's clock: the time it was seen
    decoding. None when untimed, not live, or when its content chunks span less than ``LIVE_SPAN`` of the time
    from the send to the last of them (a server whose front end lags its engine, as vLLM's does on a busy
    CPU, sends a finished request's tokens in one rush: that window shows when they were sent, not decoded)."""
    if sent_at is None:
        return None
    requests = rows.frames()[2]
    if requests.height != 1:
        return None
    first, last, live = requests["ttft_s"][0], requests["t_last_content"][0], requests["stream_live"][0]
    if first is None or last is None or not live:  # a stream released in one burst shows no time it was decoding
        return None
    if (
        last - first < LIVE_SPAN * last
    ):  # its tokens came in a rush at the end: the server sent them late, not as it decoded them
        return None
    return sent_at + first, sent_at + last


def _pieces(rows) -> list[bytes | None]:
    """The bytes of each completion token of one parsed capture, in order (None where a token has neither bytes nor text):
    the prefill arm puts a reference's first j of them into its prompt."""
    import polars as pl

    tokens = rows.frames()[0].filter(pl.col("segment") == "completion").sort("position")
    return [
        bytes(b) if b is not None else t.encode("utf-8") if t is not None else None
        for b, t in zip(tokens["token_bytes"].to_list(), tokens["token_text"].to_list())
    ]


def _identities(rows) -> tuple:
    """The token identities of the one completion a parsed capture holds (empty when it has none)."""
    from ..metrics import parity

    tokens, _, _ = rows.frames()
    return next(iter(parity.streams(tokens).values()), parity.Stream(("none",), ())).identities


def _supersede(folder: Path, manifest: dict[str, Any], retry_refused: bool = False) -> int:
    """Before a resume: move what unfinished units wrote out of the way (nothing is deleted); how many requests moved.

    With ``retry_refused``, units that finished with a refused request count as unfinished too.
    """
    if retry_refused:
        refused_units = {r.get("unit") for r in manifest.get("refused", [])}
        manifest["done"] = [key for key in manifest.get("done", []) if key not in refused_units]
    done = set(manifest.get("done", []))
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    aside = folder / "superseded" / stamp
    moved = 0
    captures = folder / "captures" / "requests.jsonl"
    if captures.exists():
        keep: list[str] = []
        drop: list[str] = []
        for line in captures.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                unit = json.loads(line).get("unit")
            except (
                ValueError,
                RecursionError,
                AttributeError,
            ):  # the last append, cut short by a kill (or not an object): set aside
                unit = None
            (keep if unit in done else drop).append(line)
        if drop:
            aside.mkdir(parents=True, exist_ok=True)
            (aside / "requests.jsonl").write_text("\n".join(drop) + "\n", encoding="utf-8")
            temporary = captures.with_suffix(".tmp")
            temporary.write_text("".join(line + "\n" for line in keep), encoding="utf-8")
            os.replace(temporary, captures)
            moved += len(drop)
    partial = folder / "partial"
    leftovers = sorted(partial.iterdir()) if partial.is_dir() else []
    if leftovers:
        (aside / "partial").mkdir(parents=True, exist_ok=True)
        for path in leftovers:
            shutil.move(str(path), aside / "partial" / path.name)
        moved += sum(path.suffix == ".sse" for path in leftovers)
    stale = [r for r in manifest.get("refused", []) if r.get("unit") not in done]
    manifest["refused"] = [r for r in manifest.get("refused", []) if r.get("unit") in done]
    manifest["m_formed"] = [m for m in manifest.get("m_formed", []) if m.get("unit") in done]
    manifest.setdefault("superseded", []).extend({**r, "superseded_at": stamp} for r in stale)
    return moved


def _load_for_resume(folder: Path) -> dict[str, Any]:
    from ..run import RunError, load_manifest

    path = folder / "manifest.json"
    if not path.exists():
        raise NoRunToResume(f"{folder}: no manifest.json to resume")
    try:
        manifest = load_manifest(folder)  # JSON within the nesting guard, every field of its type
    except RunError as exc:
        raise RunUnreadable(f"{exc}; it cannot be resumed") from None
    if manifest.get("producer") != "bia probe" or "done" not in manifest:
        raise ProbeError(
            f"{path}: not a run bia probe wrote (producer {manifest.get('producer')!r}); it cannot be resumed"
        )
    lacking = [key for key in ("requested", "ladder", "prompts", "sampler") if key not in manifest]
    if lacking:
        raise ProbeError(f"{path}: lacks {', '.join(lacking)}; it cannot be resumed")
    textless = [i for i, prompt in enumerate(manifest["prompts"]) if not isinstance(prompt.get("text"), str)]
    if textless:
        raise ProbeError(
            f'{path}: field "prompts[{textless[0]}].text": a resumed run fires its prompts again and needs their text'
        )
    return manifest
