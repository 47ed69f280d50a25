"""The columnar kit's frames: a run's completion tokens numbered into ``steps`` and its top-k lists into ``cands``
(:func:`build_steps`, :class:`Steps`), with the token identities and float32 bits they carry. What the frames hold is
told in ``_columnar``, the kit's face."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from ...dumps import CANDIDATE_SCHEMA, REQUEST_SCHEMA, TOKEN_SCHEMA

if TYPE_CHECKING:
    from polars._typing import EngineType

REQUEST_KEY = ["part", "source", "record", "choice_index"]
_CODED_KEY = ["part", "source_code", "record", "choice_index"]
_PACK = 1 << 31  # (step, token id) packed as step * _PACK + id when both are below it


@dataclass(frozen=True)
class Steps:
    """The ``steps`` and ``cands`` frames of some requests, and each request's number and length.

    ``requests`` maps each request key (``part``, ``source``, ``record``, ``choice_index``) to its
    ``req`` and ``length`` (0 for a request without completion tokens).
    """

    steps: pl.DataFrame
    cands: pl.DataFrame
    requests: pl.DataFrame
    firsts: pl.DataFrame  # the candidates a KL counts (``first``), with their probability ``prob``
    packed: bool = False  # ``key`` packs (step, token id) into one integer


def of_requests(steps: Steps, reqs: pl.Series) -> Steps:
    """The same steps, only those of the requests ``reqs``: a few pairs among many requests (each prompt's references among
    a run's bands) are compared on these as on the whole, reading a fraction of the rows.

    Parameters
    ----------
    steps : Steps
        The steps.
    reqs : polars.Series
        The requests' ``req`` to keep.

    Returns
    -------
    Steps
    """
    keep = pl.col("req").is_in(
        reqs.unique().implode()
    )  # one list to look in (a bare Series of the same type is deprecated)
    return Steps(
        steps.steps.filter(keep),
        steps.cands.filter(keep),
        steps.requests.filter(keep),
        steps.firsts.filter(keep),
        steps.packed,
    )


def _lazy(frame: Any, schema: dict) -> pl.LazyFrame:
    if isinstance(frame, pl.LazyFrame):
        return frame
    if isinstance(frame, pl.DataFrame):
        return frame.lazy()
    return pl.from_pandas(frame, schema_overrides=schema).lazy()


def _identity(token_id: str, text: str, data: str, as_int: bool) -> pl.Expr:
    """A token's identity as one comparable value: its id, else its text and bytes (``parity._identity``).

    When every token of the frames has an id, the id itself; else a string that no two different
    identities share (``#id`` or ``$hex(text):hex(bytes)``, ``-`` for a missing part).
    """
    if as_int:
        return pl.col(token_id)
    hex_text = pl.col(text).cast(pl.Binary).bin.encode("hex").fill_null("-")
    hex_bytes = pl.col(data).bin.encode("hex").fill_null("-")
    return (
        pl.when(pl.col(token_id).is_not_null())
        .then(pl.lit("#") + pl.col(token_id).cast(pl.String))
        .otherwise(pl.lit("$") + hex_text + pl.lit(":") + hex_bytes)
    )


def float32_bits(value: pl.Expr) -> pl.Expr:
    """A value's float32 bits as an integer (``parity.same_float32`` compares these: -0.0 is not 0.0).

    Parameters
    ----------
    value : polars.Expr
        Floats.

    Returns
    -------
    polars.Expr
        Int64.
    """
    return value.cast(pl.Float32).reinterpret(dtype=pl.Int32).cast(pl.Int64)


def recorded_bits(value: pl.Expr) -> pl.Expr:
    """A value's bits at the precision it was recorded in, as an integer: the float64 a reader parsed, bit for bit (a
    float32 a server wrote reads back as the same float64 every time, so this is as fine as float32 bits for it, and finer
    for a float64). Null for a value that is null or not finite: its bits are unknown, not equal to anything.

    Parameters
    ----------
    value : polars.Expr
        Floats.

    Returns
    -------
    polars.Expr
        Int64.

    Examples
    --------
    >>> frame = pl.DataFrame({"v": [-0.5, -0.5 - 1e-9, float("nan"), None]})
    >>> frame.select(b=recorded_bits(pl.col("v")))["b"].is_null().to_list(), frame.select(b=recorded_bits(pl.col("v")))["b"].n_unique()
    ([False, False, True, True], 3)
    """
    value = value.cast(pl.Float64)
    return pl.when(value.is_finite()).then(value.reinterpret(dtype=pl.Int64))


def ordered_bits(bits: pl.Expr) -> pl.Expr:
    """Float32 bits moved onto a line where float order is integer order (``parity.ulp_distance``: -0.0 and 0.0 meet).

    Parameters
    ----------
    bits : polars.Expr
        Float32 bits, as :func:`float32_bits` gives them.

    Returns
    -------
    polars.Expr
    """
    return pl.when(bits < 0).then(-(bits.and_(0x7FFFFFFF))).otherwise(bits)


def build_steps(parts: Sequence[tuple[Any, Any, Any]], *, engine: EngineType = "auto") -> Steps:
    """The ``steps`` and ``cands`` frames of the completion tokens of one or more dumps.

    ``parts`` holds (tokens, candidates, requests) frames, polars or pandas, eager or lazy; a
    request is known by its part and its key (source, record, choice_index). Only requests the
    ``requests`` frames list are numbered.

    Parameters
    ----------
    parts : sequence of tuple
        (tokens, candidates, requests) frames, one triple per dump.
    engine : str, default "auto"
        The polars engine that collects the tokens.

    Returns
    -------
    Steps
    """
    coded = (
        pl.col("source").cast(pl.Categorical).to_physical().alias("source_code")
    )  # joins on integers, not on strings
    tokens_plan = pl.concat(
        [
            _lazy(t, TOKEN_SCHEMA)
            .filter(pl.col("segment") == "completion")
            .with_columns(coded, part=pl.lit(i, pl.Int64))
            .select(*_CODED_KEY, "position", "token_id", "token_text", "token_bytes", "logprob")
            for i, (t, _, _) in enumerate(parts)
        ]
    )
    cands_plan = pl.concat(
        [
            _lazy(c, CANDIDATE_SCHEMA)
            .filter((pl.col("segment") == "completion") & (pl.col("list_kind") == "top_logprobs"))
            .with_columns(coded, part=pl.lit(i, pl.Int64))
            .select(
                *_CODED_KEY,
                "position",
                "list_index",
                "cand_token_id",
                "cand_token_text",
                "cand_token_bytes",
                "cand_logprob",
                "is_duplicate",
            )
            for i, (_, c, _) in enumerate(parts)
        ]
    )
    keys_plan = (
        pl.concat(
            [
                _lazy(r, REQUEST_SCHEMA)
                .with_columns(coded, part=pl.lit(i, pl.Int64))
                .select(*REQUEST_KEY, "source_code")
                for i, (_, _, r) in enumerate(parts)
            ]
        )
        .unique(maintain_order=True)
        .with_row_index("req")
        .with_columns(pl.col("req").cast(pl.Int64))
    )
    keys = keys_plan.collect()
    tokens_plan = tokens_plan.join(keys.lazy().select(*_CODED_KEY, "req"), on=_CODED_KEY, how="inner").sort(
        "req", "position"
    )
    tokens = (
        tokens_plan.with_columns(idx=pl.int_range(pl.len(), dtype=pl.Int64).over("req"))
        .with_row_index("step")
        .collect(engine=engine)
    )
    tokens = tokens.with_columns(pl.col("step").cast(pl.Int64))
    cands = _numbered_candidates(cands_plan.collect(engine=engine), tokens)
    keys = keys.drop("source_code")
    as_int = tokens["token_id"].null_count() == 0 and cands["cand_token_id"].null_count() == 0
    recorded = recorded_bits(pl.col("cand_logprob"))
    cands = cands.select(
        "req",
        "idx",
        "step",
        "is_duplicate",
        ident=_identity("cand_token_id", "cand_token_text", "cand_token_bytes", as_int),
        logprob=pl.col("cand_logprob"),
        # each alternative's (token, recorded bits) as one number, by its id and by its text and bytes: two lists are
        # compared by id where both sides have ids, else by text (a server that sends ids on one side only)
        by_id=pl.struct("cand_token_id", recorded).hash(seed=0),
        by_text=pl.struct("cand_token_text", "cand_token_bytes", recorded).hash(seed=0),
        has_id=pl.col("cand_token_id").is_not_null(),
    ).with_columns(finite=pl.col("logprob").is_finite().fill_null(False))
    # One integer per (step, candidate id) when ids and steps fit 31 bits each: joins and distinct counts on it are far faster.
    packed = (
        as_int
        and cands.height > 0
        and cast(int, cands["ident"].min()) >= 0
        and cast(int, cands["ident"].max()) < _PACK
        and tokens.height < _PACK
    )  # as_int: ident is the Int64 id, with no null
    cands = cands.with_columns(key=(pl.col("step") * _PACK + pl.col("ident")) if packed else pl.lit(None, pl.Int64))
    if cands["is_duplicate"].null_count() == 0 and not cands["is_duplicate"].any():
        cands = cands.with_columns(
            first=pl.col("finite")
        )  # the reader saw no token twice in any list: every finite entry is its token's first
    else:
        distinct = pl.col("key") if packed else pl.struct("req", "idx", "ident")
        cands = cands.with_columns(
            first=pl.col("finite") & pl.when(pl.col("finite")).then(distinct).is_first_distinct()
        )
    # cands are in step order (_numbered_candidates): a group-by over sorted steps takes slices, not hashes
    per_step = (
        cands.with_columns(pl.col("step").set_sorted())
        .group_by("step", maintain_order=True)
        .agg(
            n_cands=pl.len().cast(pl.Int64),
            cand_list=pl.col("ident"),
            values=pl.when(pl.col("finite")).then(pl.col("logprob")),
            # the list's (token, bits) pairs as one order-free number: two steps whose lists hold the same pairs have the same
            # signature, whatever the order the server listed them in; a list with a value not recorded (null, NaN,
            # infinite) has its bits unknown
            cand_sig=pl.col("by_id").sum(),
            cand_sig_text=pl.col("by_text").sum(),
            cand_ids=pl.col("has_id").all(),
            cand_unknown=(~pl.col("finite")).any(),
        )
    )
    second = pl.col("values").list.sort(descending=True, nulls_last=True).list.get(1, null_on_oob=True)
    per_step = per_step.with_columns(
        top1=pl.col("values").list.max(), margin=pl.col("values").list.max() - second
    ).drop("values")
    steps = (
        tokens.select(
            "req",
            "idx",
            "step",
            "position",
            "token_id",
            "token_text",
            "token_bytes",
            ident=_identity("token_id", "token_text", "token_bytes", as_int),
            logprob=pl.col("logprob"),
            bits=float32_bits(pl.col("logprob")),
            bits64=recorded_bits(pl.col("logprob")),
        )
        .with_columns(ordered=ordered_bits(pl.col("bits")))
        .join(per_step, on="step", how="left", maintain_order="left")
        .with_columns(pl.col("n_cands").fill_null(0))
    )
    lengths = steps.group_by("req").agg(length=pl.len().cast(pl.Int64))
    requests = keys.join(lengths, on="req", how="left").with_columns(pl.col("length").fill_null(0))
    firsts = cands.filter(pl.col("first")).select("req", "idx", "step", "ident", "key", prob=pl.col("logprob").exp())
    return Steps(steps, cands.drop("finite", "is_duplicate", "by_id", "by_text", "has_id"), requests, firsts, packed)


def _numbered_candidates(cands: pl.DataFrame, tokens: pl.DataFrame) -> pl.DataFrame:
    """Each candidate with its token's ``req``, ``idx`` and ``step``, in step and list order.

    A list's candidates come in one run of rows in every reader's output, so the runs, not the
    rows, are joined to the tokens (a join of one row per token), and each row takes its run's
    numbers by position. Rows in any other order still work: each stretch is a run of its own.
    """
    key = [*_CODED_KEY, "position"]
    starts = pl.any_horizontal([pl.col(k).ne_missing(pl.col(k).shift(1)) for k in key]).fill_null(True)
    cands = cands.with_columns(run=starts.cast(pl.Int64).cum_sum() - 1)
    heads = cands.filter(starts).select("run", *key).join(tokens.select(*key, "step"), on=key, how="inner")
    n_runs = cast(int, cands["run"].max()) + 1 if cands.height else 0  # run numbers from 0, with no null
    step_of_run = pl.Series("step", [None] * n_runs, dtype=pl.Int64).scatter(heads["run"], heads["step"])
    cands = cands.with_columns(step=step_of_run.gather(cands["run"])).filter(pl.col("step").is_not_null())
    cands = cands.with_columns(req=tokens["req"].gather(cands["step"]), idx=tokens["idx"].gather(cands["step"])).drop(
        "run", *_CODED_KEY, "position"
    )
    step, index = pl.col("step").diff(), pl.col("list_index").diff()
    in_order = cands.select(((step > 0) | ((step == 0) & (index >= 0))).fill_null(True).all()).item()
    return cands if in_order else cands.sort("step", "list_index")
