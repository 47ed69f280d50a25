"""MLPerf Inference accuracy logs (``mlperf_log_accuracy.json``) read into the dump schema: token ids, no logprobs.

MLPerf's loadgen writes one entry per completed query sample: a JSON list of ``{"seq_id": int, "qsl_idx": int,
"data": "<hex>"}``, where ``data`` is the bytes the SUT handed to ``lg.QuerySampleResponse`` written as hex. The
LLM reference SUTs (mlcommons/inference ``language/llama2-70b/SUT.py``, ``language/mixtral-8x7b/SUT.py``) hand it
the output token ids as a numpy array's ``.tobytes()`` (int64 from the offline path's tensors, int32 where they
build ``np.array(tokens, np.int32)``); the evaluation scripts read them back with
``np.frombuffer(bytes.fromhex(entry["data"]), dtype)``, ``dtype`` int64 by default and int32 on request
(``language/llama2-70b/evaluate-accuracy.py``, ``language/llama3.1-405b/evaluate-accuracy.py``,
``language/mixtral-8x7b/evaluate-accuracy.py``, ``language/gpt-j/evaluation.py``). Here the bytes are read as
little-endian integers of that width, whatever the machine reading them.

Each entry's hex is decoded once (``bytes.fromhex``) into its place in one buffer, read as one array and cut into
requests by offsets: no Python loop runs per token. Every refusal is a :class:`DumpError` naming the file, the entry
(its index in the list) and the field.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import ClassVar, cast

import numpy as np
import orjson
import polars as pl

from .. import _json
from .._schema import REQUEST_SCHEMA, TOKEN_SCHEMA, conform
from .._values import DumpError

FORMAT = "mlperf_accuracy_log"
# little-endian: what the SUTs' .tobytes() wrote on x86 and Arm
DTYPES: dict[str, np.dtype] = {"int64": np.dtype("<i8"), "int32": np.dtype("<i4")}
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


@dataclass(frozen=True)
class MlperfLog:
    """One accuracy log, columnar: per entry its index in the file (``record``), ``qsl_idx``, ``seq_id`` (None where
    absent) and its other keys as JSON (None for none), and every entry's token ids end to end (the ``k``-th entry's
    are ``token_ids[offsets[k]:offsets[k + 1]]``)."""

    FORMAT: ClassVar[str] = FORMAT
    source: str
    record: np.ndarray
    qsl_idx: np.ndarray
    seq_id: list[int | None]
    extra: list[str | None]
    offsets: np.ndarray
    token_ids: np.ndarray

    def subset(self, keep: np.ndarray) -> MlperfLog:
        """The log of the entries where ``keep`` (a boolean per entry) is true, each with its own record and tokens.

        Parameters
        ----------
        keep : numpy.ndarray
            One bool per entry.

        Returns
        -------
        MlperfLog
            ``self`` when every entry is kept.

        Examples
        --------
        >>> log = MlperfLog("x", np.arange(3), np.array([4, 5, 6]), [0, 1, 2], [None] * 3, np.array([0, 2, 3, 5]), np.arange(5))
        >>> part = log.subset(np.array([True, False, True]))
        >>> part.record.tolist(), part.qsl_idx.tolist(), part.offsets.tolist(), part.token_ids.tolist()
        ([0, 2], [4, 6], [0, 2, 4], [0, 1, 3, 4])
        """
        if keep.all():  # every sample compared: no copy of hundreds of MB of ids
            return self
        counts = np.diff(self.offsets)
        offsets = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
        np.cumsum(counts[keep], out=offsets[1:])
        picked = np.flatnonzero(keep).tolist()
        return MlperfLog(
            self.source,
            self.record[keep],
            self.qsl_idx[keep],
            [self.seq_id[k] for k in picked],
            [self.extra[k] for k in picked],
            offsets,
            self.token_ids[np.repeat(keep, counts)],
        )

    def frames(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The ``tokens`` and ``requests`` frames of the dump schema: one request per entry (``record`` its index,
        ``sample_key`` its ``qsl_idx``, ``request_id`` its ``seq_id``); every token's logprob is ``missing``."""
        counts = np.diff(self.offsets)
        records = self.record
        positions = np.arange(len(self.token_ids), dtype=np.int64)
        positions -= np.repeat(self.offsets[:-1], counts)  # in place: a log's tokens are hundreds of MB a column
        tokens = pl.DataFrame({"record": np.repeat(records, counts), "position": positions, "token_id": self.token_ids})
        tokens = conform(
            tokens.with_columns(
                source=pl.lit(self.source),
                choice_index=pl.lit(0, pl.Int64),
                segment=pl.lit("completion"),
                value_status=pl.lit("missing"),
                value_kind=pl.lit("logprob"),
                source_format=pl.lit(FORMAT),
            ),
            TOKEN_SCHEMA,
        )
        requests = pl.DataFrame(
            {
                "record": records,
                "sample_key": self.qsl_idx.astype(str),
                "completion_tokens": counts,
                "request_id": pl.Series([None if s is None else str(s) for s in self.seq_id], dtype=pl.String),
                "extra": pl.Series(self.extra, dtype=pl.String),
            }
        )
        requests = conform(
            requests.with_columns(
                source=pl.lit(self.source),
                choice_index=pl.lit(0, pl.Int64),
                source_format=pl.lit(FORMAT),
                n_completion_scored=pl.col("completion_tokens"),
                n_prompt_scored=pl.lit(0, pl.Int64),
            ),
            REQUEST_SCHEMA,
        )
        return tokens, requests


def read_mlperf_log(path: str | os.PathLike[str], dtype: str = "int64") -> MlperfLog:
    """Read one ``mlperf_log_accuracy.json``: each entry's sample, sequence number and output token ids.

    Parameters
    ----------
    path : path
        The log.
    dtype : {"int64", "int32"}
        The width the SUT wrote its token ids in (little-endian).

    Returns
    -------
    MlperfLog
        Columnar: :meth:`MlperfLog.frames` gives its ``tokens`` and ``requests`` in the dump schema.

    Raises
    ------
    DumpError
        Naming the file, the entry (``entry k``, its index in the list) and the field.

    Examples
    --------
    >>> import json, tempfile, numpy as np
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as folder:  # loadgen writes the hex in upper case
    ...     path = Path(folder, "mlperf_log_accuracy.json")
    ...     _ = path.write_text(json.dumps([{"seq_id": 0, "qsl_idx": 7, "data": np.array([13, 2], np.int64).tobytes().hex().upper()}]))
    ...     log = read_mlperf_log(path)
    >>> log.qsl_idx.tolist(), log.token_ids.tolist(), log.offsets.tolist()
    ([7], [13, 2], [0, 2])
    """
    width = _dtype(dtype)
    source = os.fspath(path)
    with open(source, "rb") as handle:
        entries = _entries(
            _parse(handle.read(), source), source
        )  # neither the file's bytes nor the parsed list outlive this line
    offsets, token_ids = _decode(entries.texts, source, width, dtype)
    entries.texts.clear()  # the hex, twice the ids' size, is no longer needed
    _check_token_counts(entries.token_count, np.diff(offsets), source, dtype)
    return MlperfLog(
        source,
        np.arange(len(offsets) - 1, dtype=np.int64),
        np.array(entries.qsl_idx, dtype=np.int64),
        entries.seq_id,
        entries.extra,
        offsets,
        token_ids,
    )


def _parse(raw: bytes, source: str) -> object:
    """The log's JSON, as strictly as every dump is read (:func:`analysis.dumps._json.loads_payload`: no key twice in an object, no
    deep nesting), but without its whole-document checks when loadgen's shape shows they cannot fail."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = None
    if value is not None and _flat_and_unique(value, raw):
        return value
    try:
        return _json.loads_payload(raw)  # the strict reader names what is wrong, or reads what orjson refused (NaN)
    except ValueError as exc:
        raise DumpError(source, "$", *_json.refusal(exc)) from None


def _flat_and_unique(value: object, raw: bytes) -> bool:
    """Whether ``value`` is a list of objects of scalars (so two levels deep) parsed from text with one colon per member
    (so no object named a key twice: each member written has a colon, and the hex strings hold none)."""
    if not isinstance(value, list) or not all(type(entry) is dict for entry in value):
        return False
    if any(isinstance(v, (list, dict)) for entry in value for v in entry.values()):
        return False
    return raw.count(b":") == sum(map(len, value))


def _dtype(dtype: str) -> np.dtype:
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(
            f"dtype must be one of {', '.join(map(repr, DTYPES))} (how the SUT wrote its token ids), got {dtype!r}"
        )
    return DTYPES[dtype]


_KNOWN = (
    "seq_id",
    "qsl_idx",
    "data",
)  # every other key of an entry (loadgen's token_count, token_data) is kept in extra.mlperf


@dataclass
class _Entries:
    """The entries' fields, one list each, as read and checked."""

    qsl_idx: list[int]
    seq_id: list[int | None]
    token_count: list[int | None]
    extra: list[str | None]
    texts: list[str]


def _entries(payload: object, source: str) -> _Entries:
    """Each entry's fields, each checked: one pass over the entries, none over tokens."""
    if not isinstance(payload, list):
        raise DumpError(
            source,
            "$",
            None,
            f"expected a JSON list of {{seq_id, qsl_idx, data}} entries (loadgen's accuracy log), "
            f"got a JSON {type(payload).__name__}",
        )
    out = _Entries([], [], [], [], [])
    for k, entry in enumerate(payload):
        _add_entry(out, entry, source, k)
    return out


def _add_entry(out: _Entries, entry: object, source: str, k: int) -> None:
    """Check the ``k``-th entry's fields and append them to ``out``."""
    if not isinstance(entry, dict):
        raise DumpError(
            source,
            f"entry {k}",
            None,
            f"expected an object {{seq_id, qsl_idx, data}}, got {type(entry).__name__} {entry!r:.60}",
        )
    if "qsl_idx" not in entry:
        raise DumpError(source, f"entry {k}", "qsl_idx", "missing: the sample's index in the query sample library")
    out.qsl_idx.append(cast(int, _integer(entry, "qsl_idx", source, k)))  # not None: the key is there
    out.seq_id.append(_integer(entry, "seq_id", source, k))
    out.token_count.append(_integer(entry, "token_count", source, k))
    data = entry.get("data")
    if not isinstance(data, str):
        problem = (
            "missing: the hex of the output token ids"
            if "data" not in entry
            else f"expected a hex string, got {type(data).__name__}"
        )
        raise DumpError(source, f"entry {k}", "data", problem)
    out.texts.append(data)
    others = {key: value for key, value in entry.items() if key not in _KNOWN}
    out.extra.append(
        json.dumps({"mlperf": others}, sort_keys=True) if others else None
    )  # nested: no key of loadgen's reads as one of bia's


def _integer(entry: dict, name: str, source: str, k: int) -> int | None:
    """An entry's integer field (None when the entry has no such key)."""
    if name not in entry:
        return None
    value = entry[name]
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise DumpError(source, f"entry {k}", name, f"expected an integer >= 0, got {value!r:.60}")
    return value


def _decode(texts: list[str], source: str, width: np.dtype, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Token offsets (one more than entries) and every token id as int64, from the entries' hex strings: each entry's
    hex decoded once, straight into its place in one buffer."""
    chars = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    _check_lengths(chars, source, width, dtype)
    ends = np.cumsum(chars // 2).tolist()
    buffer = bytearray(ends[-1] if ends else 0)
    view = memoryview(buffer)
    start = 0
    for k, (text, end) in enumerate(zip(texts, ends)):
        try:
            view[start:end] = bytes.fromhex(text)
        except (
            ValueError
        ):  # a character no hex digit; whitespace, which fromhex skips, leaves too few bytes for the place
            _refuse_hex(text, k, source)
        start = end
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(chars // (2 * width.itemsize), out=offsets[1:])
    return offsets, np.frombuffer(buffer, dtype=width).astype(np.int64, copy=False)


def _check_lengths(chars: np.ndarray, source: str, width: np.dtype, dtype: str) -> None:
    """Every entry's hex is whole bytes, and whole token ids of ``width``."""
    odd = np.flatnonzero(chars % 2)
    if odd.size:
        k = int(odd[0])
        raise DumpError(
            source, f"entry {k}", "data", f"{chars[k]} hex digits: an odd count is no whole number of bytes"
        )
    ragged = np.flatnonzero((chars // 2) % width.itemsize)
    if ragged.size:
        k = int(ragged[0])
        raise DumpError(
            source,
            f"entry {k}",
            "data",
            f"{chars[k] // 2} bytes is no whole number of {dtype} token ids ({width.itemsize} bytes "
            "each); was the log written with another dtype?",
        )


def _check_token_counts(stated: list[int | None], counts: np.ndarray, source: str, dtype: str) -> None:
    """loadgen's ``token_count`` (the SUT's ``n_tokens``), where an entry has one, is the number of ids its data holds:
    compliance TEST06 holds every entry to it (mlcommons/inference ``compliance/TEST06/run_verification.py``)."""
    for k, (told, held) in enumerate(zip(stated, counts.tolist())):
        if told is not None and told != held:
            raise DumpError(
                source,
                f"entry {k}",
                "token_count",
                f"says {told} tokens, but data holds {held} {dtype} token ids "
                "(the SUT's n_tokens disagrees with its output, or the log was written with another dtype)",
            )


def _refuse_hex(text: str, k: int, source: str) -> None:
    """Name the first character of entry ``k``'s hex that is no hex digit."""
    bad = next(i for i, ch in enumerate(text) if ch not in _HEX_DIGITS)
    raise DumpError(source, f"entry {k}", "data", f"character {bad} is {text[bad]!r}, not a hex digit")
