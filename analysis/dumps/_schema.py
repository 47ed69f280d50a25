"""One schema for every dump format, and the builder every format parser writes into.

``tokens``: one row per scored position. Key: (source, record, choice_index, segment, position).
``candidates``: one row per candidate as delivered (order and duplicates kept). Key: the token
key plus (list_kind, list_index). ``requests``: one row per request and choice.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from ..core import INT64_MAX, INT64_MIN
from ._values import FLOAT32_LOWEST, MAX_LOGPROB, SENTINEL_9999, DumpError, classify_logprob, classify_prob

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

KEY: dict[str, PolarsDataType] = {
    "source": pl.String,
    "record": pl.Int64,  # line of a JSONL file, else 0: the request within the source
    "choice_index": pl.Int64,
    "segment": pl.String,  # "prompt" | "completion"
    "position": pl.Int64,
}

TOKEN_SCHEMA: dict[str, PolarsDataType] = {
    **KEY,
    "request_id": pl.String,
    "sample_key": pl.String,
    "token_id": pl.Int64,
    "token_text": pl.String,
    "token_bytes": pl.Binary,
    "logprob": pl.Float64,
    "prob": pl.Float64,
    "raw_value": pl.Float64,
    "value_status": pl.String,
    "value_kind": pl.String,  # "logprob" | "prob" | "logit"
    "logprob_semantics": pl.String,
    "vocab_rank": pl.Int64,
    "text_offset": pl.Int64,
    "top_k_requested": pl.Int64,
    "n_candidates": pl.Int64,
    "support_size": pl.Int64,
    "stream_chunk": pl.Int64,
    "t_arrival": pl.Float64,
    "loss_mask": pl.Boolean,
    "source_format": pl.String,
}

CANDIDATE_SCHEMA: dict[str, PolarsDataType] = {
    **KEY,
    "list_kind": pl.String,  # "top_logprobs" | "sampling_support" | "requested_ids" | "full_vocab"
    "list_index": pl.Int64,
    "cand_token_id": pl.Int64,
    "cand_token_text": pl.String,
    "cand_token_bytes": pl.Binary,
    "cand_logprob": pl.Float64,
    "cand_prob": pl.Float64,
    "cand_raw_value": pl.Float64,
    "cand_status": pl.String,
    "cand_vocab_rank": pl.Int64,
    "is_sampled": pl.Boolean,
    "is_duplicate": pl.Boolean,
}

REQUEST_SCHEMA: dict[str, PolarsDataType] = {
    "source": pl.String,
    "record": pl.Int64,
    "choice_index": pl.Int64,
    "request_id": pl.String,
    "sample_key": pl.String,
    "source_format": pl.String,
    "model": pl.String,
    "endpoint": pl.String,
    "stream": pl.Boolean,
    "finish_reason": pl.String,
    "prompt_tokens": pl.Int64,
    "completion_tokens": pl.Int64,
    "n_prompt_scored": pl.Int64,
    "n_completion_scored": pl.Int64,
    "completion_text": pl.String,
    "c": pl.Int64,
    "slot": pl.Int64,
    "prompt_id": pl.String,
    "role": pl.String,  # in a run: "reference" (slot 0 is ref #1) or "band"
    "repeat": pl.Int64,  # in a run: which repeat of the band
    "t_sent": pl.Float64,
    "ttft_s": pl.Float64,  # arrival of the first content-bearing chunk, seconds after t_sent's clock start
    "t_last_content": pl.Float64,  # arrival of the last content-bearing chunk
    "n_content_chunks": pl.Int64,
    "stream_live": pl.Boolean,  # live: declared ("stream_mode": "live") or observed from the arrival times (_liveness.liveness)
    "liveness": pl.String,  # how that is known: declared live | declared replay | observed live | observed burst | observed rush | untimed
    "raw_sha256": pl.String,
    "extra": pl.String,  # JSON of what the schema has no column for (routed experts, usage, ...)
}


_INT = (int,)
_PYTHON_TYPES: dict[PolarsDataType, tuple[type, ...]] = {
    pl.String: (str,),
    pl.Int64: _INT,
    pl.Float64: (int, float),
    pl.Boolean: (bool,),
    pl.Binary: (bytes,),
}


def _check_types(source: str, where: str, row: dict[str, Any], schema: dict[str, PolarsDataType], names) -> None:
    """Values copied from a payload must fit their column: a list is not a request id."""
    for name in names:
        value = row.get(name)
        if value is None:
            continue
        allowed = _PYTHON_TYPES.get(schema[name])
        if allowed is None:
            continue
        if not isinstance(value, allowed) or (isinstance(value, bool) and schema[name] is not pl.Boolean):
            raise DumpError(
                source,
                where,
                name,
                f"expected {schema[name]} for column {name}, got {type(value).__name__} {value!r:.60}",
            )
        if allowed is _INT and not INT64_MIN <= cast(int, value) <= INT64_MAX:  # an int: isinstance above
            raise DumpError(
                source, where, name, f"expected an integer that fits in 64 bits for column {name}, got {value}"
            )


def _clean_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return bytes(value)


class Rows:
    """Column lists for the three tables of one source, filled by a format parser.

    The parser passes raw values; the builder classifies them (sentinels to null with a
    status), checks them, and flags duplicate candidates. Errors name source, record and field.
    """

    def __init__(self, source: str, source_format: str) -> None:
        self.source, self.source_format = source, source_format
        self.tokens: dict[str, list[Any]] = {name: [] for name in TOKEN_SCHEMA}
        self.candidates: dict[str, list[Any]] = {name: [] for name in CANDIDATE_SCHEMA}
        self.requests: dict[str, list[Any]] = {name: [] for name in REQUEST_SCHEMA}
        self.skipped: list[DumpError] = []
        self._parts: dict[str, list[pl.DataFrame]] = {"tokens": [], "candidates": [], "requests": []}

    # --- tokens ------------------------------------------------------------------------------
    def token(
        self,
        key: tuple[int, int, str, int],
        where: str,
        *,
        raw: Any,
        kind: str = "logprob",
        missing: bool = False,
        **columns: Any,
    ) -> None:
        """Append one scored position. ``key`` is (record, choice_index, segment, position).

        ``missing`` marks a position the source scored with no value at all (status "missing").

        Parameters
        ----------
        key : tuple of (int, int, str, int)
            (record, choice_index, segment, position).
        where : str
            Where the position is in the source, for error messages.
        raw : object
            The value as received (a logprob or a probability, by ``kind``; None when null).
        kind : {"logprob", "prob"}, default "logprob"
            What ``raw`` is.
        missing : bool, default False
            The source scored the position with no value at all.
        **columns
            The token table's other columns (``request_id``, ``token_id``, ``token_text``, ``t_arrival``, ...).
        """
        if missing:
            logprob, prob, status = None, None, "missing"
        else:
            logprob, prob, status = self._classify(raw, kind, where, "prob" if kind == "prob" else "logprob")
        row = {
            **self._key(key),
            "logprob": logprob,
            "prob": prob,
            "raw_value": None if raw is None else float(raw),
            "value_status": status,
            "value_kind": kind,
            "source_format": columns.pop("source_format", self.source_format),
            **columns,
        }
        row["token_bytes"] = _clean_bytes(row.get("token_bytes"))
        _check_types(self.source, where, row, TOKEN_SCHEMA, columns)
        for name, column in self.tokens.items():
            column.append(row.get(name))

    def candidates_for(
        self,
        key,
        where: str,
        entries: list[dict[str, Any]],
        *,
        list_kind: str,
        sampled_id: int | None,
        sampled_text: str | None,
        kind: str = "logprob",
    ) -> None:
        """Append a candidate list in delivered order; repeated ids (or texts) are flagged.

        Parameters
        ----------
        key : tuple of (int, int, str, int)
            The position's (record, choice_index, segment, position).
        where : str
            Where the list is in the source, for error messages.
        entries : list of dict
            The candidates, each with ``raw`` and some of ``token_id``, ``token_text``, ``token_bytes``, ``vocab_rank``.
        list_kind : str
            Which list they come from (``top_logprobs``, ...).
        sampled_id : int or None
            The sampled token's id, to flag the candidate that is it.
        sampled_text : str or None
            The sampled token's text, used when the candidates have no ids.
        kind : {"logprob", "prob"}, default "logprob"
            What the ``raw`` values are.
        """
        seen: set[Any] = set()
        for index, entry in enumerate(entries):
            raw = entry.get("raw")
            logprob, prob, status = self._classify(
                raw, kind, f"{where}[{index}]", "prob" if kind == "prob" else "logprob"
            )
            cand_id, text = entry.get("token_id"), entry.get("token_text")
            identity = (
                ("id", cand_id) if cand_id is not None else ("text", text, _clean_bytes(entry.get("token_bytes")))
            )
            if sampled_id is not None and cand_id is not None:
                is_sampled = cand_id == sampled_id
            elif sampled_text is not None and cand_id is None:
                is_sampled = text == sampled_text
            else:
                is_sampled = None
            row = {
                **self._key(key),
                "list_kind": list_kind,
                "list_index": index,
                "cand_token_id": cand_id,
                "cand_token_text": text,
                "cand_token_bytes": _clean_bytes(entry.get("token_bytes")),
                "cand_logprob": logprob,
                "cand_prob": prob,
                "cand_raw_value": None if raw is None else float(raw),
                "cand_status": status,
                "cand_vocab_rank": entry.get("vocab_rank"),
                "is_sampled": is_sampled,
                "is_duplicate": identity in seen,
            }
            seen.add(identity)
            _check_types(
                self.source,
                f"{where}[{index}]",
                row,
                CANDIDATE_SCHEMA,
                ("cand_token_id", "cand_token_text", "cand_vocab_rank"),
            )
            for name, column in self.candidates.items():
                column.append(row.get(name))

    def _key(self, key: tuple[int, int, str, int]) -> dict[str, Any]:
        """The token key columns shared by a token and its candidates."""
        return {"source": self.source, "record": key[0], "choice_index": key[1], "segment": key[2], "position": key[3]}

    def request(self, **columns: Any) -> None:
        """Append one request row; ``extra`` may be a dict (stored as JSON).

        Parameters
        ----------
        **columns
            The request table's columns (``record``, ``request_id``, ``model``, ``extra``, ...); ``source`` and
            ``source_format`` default to the rows'.
        """
        columns.setdefault("source", self.source)
        columns.setdefault("source_format", self.source_format)
        extra = columns.get("extra")
        if isinstance(extra, dict):
            columns["extra"] = json.dumps(extra, sort_keys=True, default=str) if extra else None
        _check_types(
            self.source,
            f"record {columns.get('record')}",
            columns,
            REQUEST_SCHEMA,
            [n for n in columns if n in REQUEST_SCHEMA],
        )
        for name, column in self.requests.items():
            column.append(columns.get(name))

    def _classify(self, raw: Any, kind: str, where: str, field: str):
        if raw is not None and (isinstance(raw, bool) or not isinstance(raw, (int, float))):
            raise DumpError(self.source, where, field, f"expected a number or null, got {type(raw).__name__} {raw!r}")
        if kind == "logit":  # a logit is no log-probability: kept in raw_value only
            return None, None, classify_logprob(raw)[1]
        if kind == "prob":
            if raw is not None and not (0.0 <= float(raw) <= 1.0 + 1e-6) and raw == raw:
                raise DumpError(self.source, where, field, f"expected a probability in [0, 1], got {raw!r}")
            return classify_prob(raw)
        logprob, status = classify_logprob(raw)
        if logprob is not None and logprob > MAX_LOGPROB:
            raise DumpError(self.source, where, field, f"expected a logprob <= 0, got {raw!r}")
        return logprob, None if logprob is None else _exp(logprob), status

    # --- checks and frames -------------------------------------------------------------------
    def n_tokens(self) -> int:
        """Tokens appended row by row since the last bulk frame (indexes into ``self.tokens``)."""
        return len(self.tokens["position"])

    def add_frame(self, table: str, frame: pl.DataFrame) -> None:
        """Append a whole frame built with vectorized code; row order with ``token()`` is kept.

        Parameters
        ----------
        table : {"tokens", "candidates", "requests"}
            The table it belongs to.
        frame : polars.DataFrame
            Its rows; conformed to the table's schema.
        """
        self._flush(table)
        self._parts[table].append(conform(frame, SCHEMAS[table]))

    def _flush(self, table: str) -> None:
        columns = getattr(self, table)
        if next(iter(columns.values())):
            self._parts[table].append(pl.DataFrame(columns, schema=SCHEMAS[table], strict=False))
            for column in columns.values():
                column.clear()

    def frames(self) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        out = []
        for table in ("tokens", "candidates", "requests"):
            self._flush(table)
            parts = self._parts[table]
            out.append(pl.concat(parts, how="vertical") if parts else pl.DataFrame(schema=SCHEMAS[table]))
        return out[0], out[1], out[2]


def _exp(logprob: float) -> float:
    return math.exp(logprob)


SCHEMAS = {"tokens": TOKEN_SCHEMA, "candidates": CANDIDATE_SCHEMA, "requests": REQUEST_SCHEMA}


def classified(raw: pl.Expr, prefix: str = "") -> list[pl.Expr]:
    """``status``, ``logprob`` and ``prob`` columns for raw logprobs: ``classify_logprob``, vectorized.

    Parameters
    ----------
    raw : polars.Expr
        The raw logprobs.
    prefix : str, default ""
        Put before each column's name (``cand_``).

    Returns
    -------
    list of polars.Expr
    """
    status = (
        pl.when(raw.is_null())
        .then(pl.lit("null_in_source"))
        .when(raw == SENTINEL_9999)
        .then(pl.lit("sentinel_9999"))
        .when(raw.is_nan() | (raw == math.inf))
        .then(pl.lit("nonfinite"))
        .when(raw == -math.inf)
        .then(pl.lit("neg_inf"))
        .when(raw <= FLOAT32_LOWEST)
        .then(pl.lit("float_lowest"))
        .otherwise(pl.lit("ok"))
    )
    logprob = pl.when(status == "ok").then(raw)
    return [status.alias(f"{prefix}status"), logprob.alias(f"{prefix}logprob"), logprob.exp().alias(f"{prefix}prob")]


def conform(frame: pl.DataFrame, schema: dict[str, PolarsDataType]) -> pl.DataFrame:
    """Every schema column, in order and type; columns the frame lacks are null.

    Parameters
    ----------
    frame : polars.DataFrame
        The frame.
    schema : dict of str to polars data type
        The columns wanted, in order.

    Returns
    -------
    polars.DataFrame
    """
    missing = [pl.lit(None, dtype).alias(name) for name, dtype in schema.items() if name not in frame.columns]
    return frame.with_columns(missing).select([pl.col(n).cast(t) for n, t in schema.items()])


def empty_frames() -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The three tables with no rows, every column typed."""
    return pl.DataFrame(schema=TOKEN_SCHEMA), pl.DataFrame(schema=CANDIDATE_SCHEMA), pl.DataFrame(schema=REQUEST_SCHEMA)
