"""Binary encodings RL stacks put in JSON: compact logprobs (``u32-f32-le-v1``), sampling masks
(lists, CSR base64 int32, ``__nd__`` arrays, packed int64) and routed experts (kept, checked)."""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
import struct
from typing import Any

import numpy as np

from ._values import MAX_LOGPROB, DumpError

_DTYPES = {
    "int32": "<i4",
    "uint32": "<u4",
    "int64": "<i8",
    "uint8": "u1",
    "int8": "i1",
    "int16": "<i2",
    "uint16": "<u2",
    "float32": "<f4",
    "float16": "<f2",
    "bfloat16": None,
    "float64": "<f8",
}
_HEX = re.compile(r"\A(?:[0-9a-fA-F]{2})*\Z")


def b64(text: Any, source: str, where: str, field: str | None) -> bytes:
    """Strict base64: malformed text is an error naming the field.

    Parameters
    ----------
    text : object
        The base64 text (anything else is an error).
    source : str
        The source's name, for error messages.
    where : str
        Where the value is in the source.
    field : str
        The field's name, for error messages.

    Returns
    -------
    bytes
    """
    if not isinstance(text, str):
        raise DumpError(source, where, field, f"expected base64 text, got {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise DumpError(source, where, field, f"malformed base64 ({exc})") from None


def decode_compact_logprobs(compact: Any, rows, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, logprobs, offsets) arrays from ``{"format": "u32-f32-le-v1", "data", "offsets", "num_top_logprobs"}``.

    Row j is ``[offsets[j], offsets[j + 1])``.

    Parameters
    ----------
    compact : object
        The compact object as parsed.
    rows : Rows
        The rows being built (for the source's name in errors).
    where : str
        Where the object is in the source, for error messages.

    Returns
    -------
    tuple of numpy.ndarray
        Token ids (int64), logprobs (float64) and row offsets (int64).

    Examples
    --------
    >>> import types
    >>> c = {"format": "u32-f32-le-v1", "data": "BwAAAAgAAAAAAAC/AADAvw==", "offsets": [0, 1, 2]}
    >>> ids, values, offsets = decode_compact_logprobs(c, types.SimpleNamespace(source="s"), "$")
    >>> ids.tolist(), values.tolist(), offsets.tolist()
    ([7, 8], [-0.5, -1.5], [0, 1, 2])
    """
    source = rows.source
    if not isinstance(compact, dict):
        raise DumpError(source, where, None, "expected a JSON object")
    if compact.get("format") != "u32-f32-le-v1":
        raise DumpError(source, where, "format", f"expected 'u32-f32-le-v1', got {compact.get('format')!r}")
    offsets = compact.get("offsets")
    if (
        not isinstance(offsets, list)
        or not offsets
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise DumpError(source, where, "offsets", "expected a non-empty list of integers")
    if offsets[0] != 0:
        raise DumpError(source, where, "offsets", f"must start at 0, got {offsets[0]}")
    for j in range(1, len(offsets)):
        if offsets[j] <= offsets[j - 1]:
            raise DumpError(
                source,
                where,
                "offsets",
                f"must strictly increase (no empty row): offsets[{j}] = {offsets[j]} after {offsets[j - 1]}",
            )
    count = offsets[-1]
    data = b64(compact.get("data"), source, where, "data")
    if len(data) != 8 * count:
        raise DumpError(
            source, where, "data", f"decodes to {len(data)} bytes; {count} entries need exactly {8 * count}"
        )
    ids = np.frombuffer(data, dtype="<u4", count=count).astype(np.int64)
    values = np.frombuffer(data, dtype="<f4", count=count, offset=4 * count).astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(values) | (values > MAX_LOGPROB))
    if bad.size:
        raise DumpError(
            source,
            where,
            "data",
            f"value {float(values[bad[0]])!r} at entry {int(bad[0])} is not a finite logprob <= 1e-6",
        )
    return ids, values, np.asarray(offsets, dtype=np.int64)


def _nd_array(obj: dict, source: str, where: str) -> np.ndarray:
    dtype = obj.get("dtype")
    if dtype not in _DTYPES or _DTYPES[dtype] is None:
        raise DumpError(source, where, "dtype", f"unsupported dtype {dtype!r}")
    shape = obj.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise DumpError(source, where, "shape", "expected a list of non-negative integers")
    itemsize = np.dtype(_DTYPES[dtype]).itemsize
    need = math.prod(shape) * itemsize
    raw = obj.get("data")
    if isinstance(raw, str) and len(raw) == 2 * need and _HEX.match(raw):
        data = bytes.fromhex(raw)  # hex: how a JSON transcript carries the msgpack bytes
    else:
        data = b64(raw, source, where, "data")
    if len(data) != need:
        raise DumpError(source, where, "data", f"holds {len(data)} bytes; shape {shape} of {dtype} needs {need}")
    return np.frombuffer(data, dtype=_DTYPES[dtype]).reshape(shape)


def _int_array(value: Any, source: str, where: str, field: str) -> np.ndarray:
    """An int32 array given as base64 text or as an ``__nd__`` object."""
    if isinstance(value, dict) and value.get("__nd__"):
        return _nd_array(value, source, f"{where}.{field}").reshape(-1).astype(np.int64)
    data = b64(value, source, where, field)
    if len(data) % 4:
        raise DumpError(source, where, field, f"{len(data)} bytes is not a whole number of int32 values")
    return np.frombuffer(data, dtype="<i4").astype(np.int64)


def _csr_rows(mask: dict, source: str, where: str) -> list[list[int] | None]:
    ids = _int_array(mask.get("ids"), source, where, "ids")
    counts = _int_array(mask.get("counts"), source, where, "counts")
    if (counts < 0).any():
        raise DumpError(source, where, "counts", "holds a negative count")
    if int(counts.sum()) != ids.size:
        raise DumpError(source, where, "counts", f"sum to {int(counts.sum())} but ids hold {ids.size} values")
    out: list[list[int] | None] = []
    start = 0
    for count in counts.tolist():
        out.append(None if count == 0 else ids[start : start + count].tolist())
        start += count
    return out


def _unpack_int64(value: int) -> tuple[int, float]:
    bits = value & 0xFFFFFFFFFFFFFFFF
    token_id = bits & 0xFFFFFFFF
    (logprob,) = struct.unpack("<f", struct.pack("<I", bits >> 32))
    return token_id, logprob


def decode_sampling_mask(
    mask: Any, logprobs: Any, rows, where: str
) -> list[tuple[list[int], list[float] | None] | None]:
    """Per completion token: (support ids, their logprobs or None), or None where nothing was recorded.

    Rows are checked: non-empty, no duplicate id, logprobs parallel and summing to 1 within 1e-4.

    Parameters
    ----------
    mask : object
        The support per token: rows of ids (ids packed with their float32 logprob as prime-rl writes them, or plain),
        or a CSR ``{ids, counts}`` object of base64 arrays.
    logprobs : object
        The support's logprobs, parallel to ``mask``, or None.
    rows : Rows
        The rows being built (for the source's name in errors).
    where : str
        Where the mask is in the source, for error messages.

    Returns
    -------
    list

    Examples
    --------
    >>> import types
    >>> s = types.SimpleNamespace(source="s")
    >>> decode_sampling_mask([[3, 1]], [[-0.1, -2.4]], s, "$")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    analysis.DumpError: s: $ row 0: support probabilities sum to 0.99... not 1 (within 1e-4)
    >>> decode_sampling_mask({"ids": "BwAAAAMAAAA=", "counts": "AgAAAAAAAAA="}, None, s, "$")
    [([7, 3], None), None]
    """
    source = rows.source
    packed_logprobs: list[list[float]] | None = None
    if isinstance(mask, dict) and "ids" in mask:
        id_rows = _csr_rows(mask, source, where)
    elif isinstance(mask, list) and all(isinstance(r, list) for r in mask):
        flat = [v for r in mask for v in r]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
            raise DumpError(source, where, None, "expected rows of integer token ids")
        if any(v < 0 or v >= 2**32 for v in flat):  # (float32 bits << 32) | id, as prime-rl packs them
            unpacked = [[_unpack_int64(v) for v in r] for r in mask]
            id_rows = [[i for i, _ in r] for r in unpacked]
            packed_logprobs = [[lp for _, lp in r] for r in unpacked]
        else:
            id_rows = [list(r) for r in mask]
    else:
        raise DumpError(source, where, None, "expected rows of ids, a CSR {ids, counts} object, or __nd__ arrays")
    lp_rows = _logprob_rows(logprobs, id_rows, source, where) if logprobs is not None else packed_logprobs
    out: list[tuple[list[int], list[float] | None] | None] = []
    for j, ids in enumerate(id_rows):
        if ids is None:
            out.append(None)
            continue
        row_lp = None if lp_rows is None else lp_rows[j]
        _check_support_row(ids, row_lp, source, f"{where} row {j}")
        out.append((ids, row_lp))
    return out


def _logprob_rows(logprobs: Any, id_rows, source: str, where: str) -> list[list[float] | None]:
    if isinstance(logprobs, dict) and logprobs.get("__nd__"):
        flat = _nd_array(logprobs, source, f"{where}_logprobs").reshape(-1).astype(np.float64).tolist()
        out, start = [], 0
        for ids in id_rows:
            n = 0 if ids is None else len(ids)
            out.append(None if ids is None else flat[start : start + n])
            start += n
        if start != len(flat):
            raise DumpError(source, f"{where}_logprobs", None, f"holds {len(flat)} values for {start} support ids")
        return out
    if not isinstance(logprobs, list) or len(logprobs) != len(id_rows):
        raise DumpError(source, f"{where}_logprobs", None, f"expected {len(id_rows)} rows parallel to the mask")
    return logprobs


def _check_support_row(ids: list[int], logprobs: list[float] | None, source: str, where: str) -> None:
    if not ids:
        raise DumpError(source, where, None, "an empty support row")
    if len(set(ids)) != len(ids):
        raise DumpError(source, where, None, f"support row repeats an id: {ids}")
    if logprobs is None:
        return
    if len(logprobs) != len(ids):
        raise DumpError(source, where, None, f"{len(logprobs)} logprobs for {len(ids)} ids")
    total = sum(math.exp(v) for v in logprobs if v is not None)
    if abs(total - 1.0) > 1e-4:
        raise DumpError(source, where, None, f"support probabilities sum to {total!r} not 1 (within 1e-4)")


def validate_routed_experts(value: Any, rows, where: str) -> dict:
    """Check ``{data: b64, shape: [tokens, layers, top_k], start?, dtype?}``, or vLLM 0.32's chat choice string
    (base64 of ``.npy`` bytes), and keep it undecoded.

    Parameters
    ----------
    value : object
        The ``routed_experts`` value as parsed.
    rows : Rows
        The rows being built (for the source's name in errors).
    where : str
        Where the value is in the source, for error messages.

    Returns
    -------
    dict
    """
    source = rows.source
    if isinstance(value, str):
        return _npy_routed_experts(value, source, where)
    if not isinstance(value, dict):
        raise DumpError(source, where, None, "expected a JSON object")
    shape = value.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise DumpError(source, where, "shape", "expected a list of non-negative integers")
    dtype = value.get("dtype", "uint8")
    if dtype not in _DTYPES or _DTYPES[dtype] is None:
        raise DumpError(source, where, "dtype", f"unsupported dtype {dtype!r}")
    data = b64(value.get("data"), source, where, "data")
    need = math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize
    if len(data) != need:
        raise DumpError(source, where, "data", f"decodes to {len(data)} bytes; shape {shape} of {dtype} needs {need}")
    return dict(value)


def _npy_routed_experts(text: str, source: str, where: str) -> dict:
    """vLLM's chat ``routed_experts``: base64 ``.npy`` bytes of an integer ``[tokens - 1, layers, top_k]`` array. Its header
    is read (never pickles) and its length checked; the text is kept as it came, beside its shape and dtype.

    Examples
    --------
    >>> import base64, io
    >>> buffer = io.BytesIO(); np.save(buffer, np.zeros((2, 3, 2), dtype=np.uint8))
    >>> _npy_routed_experts(base64.b64encode(buffer.getvalue()).decode(), "s", "$")["shape"]
    [2, 3, 2]
    """
    data = b64(text, source, where, None)
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in readers:
            raise ValueError(f"npy version {version}")
        shape, _, dtype = readers[version](stream)
    except ValueError as exc:
        raise DumpError(source, where, None, f"expected base64 .npy bytes ({exc})") from None
    if dtype.kind not in "iu" or len(shape) != 3:
        raise DumpError(
            source, where, None, f"expected a 3-d integer array [tokens, layers, top_k], got {dtype} {list(shape)}"
        )
    need = math.prod(shape) * dtype.itemsize
    if len(data) - stream.tell() != need:
        raise DumpError(
            source,
            where,
            None,
            f"holds {len(data) - stream.tell()} bytes of data; shape {list(shape)} of {dtype} needs {need}",
        )
    return {"format": "npy", "data": text, "shape": list(shape), "dtype": dtype.name}
