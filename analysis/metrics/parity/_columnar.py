"""Parity metrics as polars queries: every stream is a set of rows, every comparison a join.

The per-stream functions in :mod:`analysis.parity` (``compare``, ``topk_kl``, ...) define each
measure on two Python streams; this module computes the same measures for every request of a run
at once, as joins of each request to its reference on the step index, group-bys and window
functions, with no Python per token or per candidate. ``tests/test_columnar.py`` checks the two
agree on random streams.

The frames here:

``steps``
    One row per completion token of a request: ``req`` (the request's number), ``idx`` (its
    0-based step: the rank of its ``position``, as a :class:`~analysis.parity.Stream` counts),
    ``ident`` (the token's identity: its id, else its text and bytes), ``logprob``, ``bits`` (its
    float32 bits) and ``ordered`` (the same moved onto a line where float order is integer order),
    and from its top-k list:
    ``n_cands``, ``cand_list`` (identities in delivered order),
    ``top1`` (the best finite logprob) and ``margin`` (top-1 minus top-2).
``cands``
    One row per delivered ``top_logprobs`` candidate: ``req``, ``idx``, ``ident``, ``logprob``,
    ``first`` (the first finite entry of its identity in its list: the one a KL counts).
``pairs``
    What to compare: ``pair``, ``ref`` and ``other`` (request numbers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import polars as pl

from ...dumps import CANDIDATE_SCHEMA, REQUEST_SCHEMA, TOKEN_SCHEMA

if TYPE_CHECKING:
    from polars._typing import EngineType

REQUEST_KEY = ["part", "source", "record", "choice_index"]
_CODED_KEY = ["part", "source_code", "record", "choice_index"]
REST_FLOOR = 1e-12  # parity.topk_kl floors its rest-of-vocabulary buckets here
_PACK = 1 << 31  # (step, token id) packed as step * _PACK + id when both are below it

COMPARISON_SCHEMA = {
    "pair": pl.Int64,
    "agree_to": pl.Int64,
    "diverged": pl.Boolean,
    "divergence_at": pl.Int64,
    "bitwise_prefix": pl.Int64,
    "max_abs_delta": pl.Float64,
    "max_ulp": pl.Int64,
    "topk_order_changes": pl.Int64,
    "topk_set_changes": pl.Int64,
    "reference_margin": pl.Float64,
    "own_margin": pl.Float64,
    "in_reference_topk": pl.Boolean,
    "near_tie": pl.Boolean,
    "length": pl.Int64,
    "reference_length": pl.Int64,
    "k3_mean": pl.Float64,
    "k3_max": pl.Float64,
    "kl_topk_mean": pl.Float64,
    "kl_topk_max": pl.Float64,
}


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
    cands = cands.select(
        "req",
        "idx",
        "step",
        "is_duplicate",
        ident=_identity("cand_token_id", "cand_token_text", "cand_token_bytes", as_int),
        logprob=pl.col("cand_logprob"),
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
        )
        .with_columns(ordered=ordered_bits(pl.col("bits")))
        .join(per_step, on="step", how="left", maintain_order="left")
        .with_columns(pl.col("n_cands").fill_null(0))
    )
    lengths = steps.group_by("req").agg(length=pl.len().cast(pl.Int64))
    requests = keys.join(lengths, on="req", how="left").with_columns(pl.col("length").fill_null(0))
    firsts = cands.filter(pl.col("first")).select("req", "idx", "step", "ident", "key", prob=pl.col("logprob").exp())
    return Steps(steps, cands.drop("finite", "is_duplicate"), requests, firsts, packed)


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


# --- two streams ----------------------------------------------------------------------------------


def _aligned(steps: Steps, pairs: pl.DataFrame, columns: Sequence[str]) -> pl.DataFrame:
    """Each pair's steps side by side on ``idx`` (the steps both streams have), ``_r`` the reference's and ``_o`` the other's."""
    ref = steps.steps.select(pl.col("req").alias("ref"), "idx", *[pl.col(c).alias(f"{c}_r") for c in columns])
    other = steps.steps.select(pl.col("req").alias("other"), "idx", *[pl.col(c).alias(f"{c}_o") for c in columns])
    return pairs.select("pair", "ref", "other").join(ref, on="ref").join(other, on=["other", "idx"])


def _with_lengths(steps: Steps, pairs: pl.DataFrame) -> pl.DataFrame:
    lengths = steps.requests.select("req", "length")
    return (
        pairs.join(lengths.rename({"req": "ref", "length": "reference_length"}), on="ref", how="left")
        .join(lengths.rename({"req": "other"}), on="other", how="left")
        .with_columns(pl.col("reference_length", "length").fill_null(0))
    )


def agreements(steps: Steps, pairs: pl.DataFrame) -> pl.DataFrame:
    """``parity.agreement`` for every pair: ``pair``, ``agree_to`` (leading steps with one identity).

    Parameters
    ----------
    steps : Steps
        The requests' steps.
    pairs : polars.DataFrame
        ``pair``, ``ref`` and ``other`` (requests' ``req``).

    Returns
    -------
    polars.DataFrame
    """
    parted = (
        _aligned(steps, pairs, ["ident"])
        .filter(pl.col("ident_r") != pl.col("ident_o"))
        .group_by("pair")
        .agg(first_difference=pl.col("idx").min())
    )
    return (
        _with_lengths(steps, pairs)
        .join(parted, on="pair", how="left")
        .select("pair", agree_to=pl.coalesce("first_difference", pl.min_horizontal("reference_length", "length")))
    )


def compare_pairs(steps: Steps, pairs: pl.DataFrame, *, epsilon: float) -> pl.DataFrame:
    """``parity.compare`` for every pair, one row each (the columns of :class:`~analysis.parity.Comparison`).

    Parameters
    ----------
    steps : Steps
        The requests' steps.
    pairs : polars.DataFrame
        ``pair``, ``ref`` and ``other`` (requests' ``req``).
    epsilon : float
        The near-tie epsilon.

    Returns
    -------
    polars.DataFrame
    """
    if pairs.height == 0:
        return pl.DataFrame(schema=COMPARISON_SCHEMA)
    base = _with_lengths(steps, pairs).join(agreements(steps, pairs), on="pair")
    base = base.with_columns(diverged=pl.col("agree_to") < pl.min_horizontal("reference_length", "length"))
    prefix = (
        _aligned(steps, pairs, ["logprob", "bits", "ordered", "n_cands", "cand_list"])
        .join(base.select("pair", "agree_to"), on="pair")
        .filter(pl.col("idx") < pl.col("agree_to"))
    )
    both = pl.col("logprob_r").is_not_null() & pl.col("logprob_o").is_not_null()
    d = pl.col("logprob_o") - pl.col("logprob_r")
    listed = (pl.col("n_cands_r") > 0) & (pl.col("n_cands_o") > 0)
    prefix = prefix.with_columns(
        k3=_expm1(d) - d,  # elementwise here: a Python function inside agg would run once per pair
        reordered=listed & (pl.col("cand_list_r") != pl.col("cand_list_o")),
    )
    prefix_stats = prefix.group_by("pair").agg(
        bits_differ=pl.col("idx").filter(~pl.col("bits_r").eq_missing(pl.col("bits_o"))).min(),
        max_abs_delta=d.abs().filter(both).max(),
        max_ulp=(pl.col("ordered_r") - pl.col("ordered_o")).abs().filter(both).max(),
        topk_order_changes=pl.col("reordered").sum().cast(pl.Int64),
        k3_mean=pl.col("k3").filter(both).mean(),
        k3_max=pl.col("k3").filter(both).max(),
    )
    # Lists in the same order hold the same set: only the steps whose order changed can change their set.
    as_set = {side: pl.col(f"cand_list_{side}").list.unique().list.sort() for side in ("r", "o")}
    set_changes = (
        prefix.filter("reordered")
        .group_by("pair")
        .agg(topk_set_changes=(as_set["r"] != as_set["o"]).sum().cast(pl.Int64))
    )
    kl = (
        _topk_kl(steps, prefix.select("pair", "ref", "other", "idx"))
        .group_by("pair")
        .agg(kl_topk_mean=pl.col("kl").mean(), kl_topk_max=pl.col("kl").max())
    )
    at_fork = _at_divergence(steps, base.filter(pl.col("diverged")))
    out = (
        base.join(prefix_stats, on="pair", how="left")
        .join(set_changes, on="pair", how="left")
        .join(kl, on="pair", how="left")
        .join(at_fork, on="pair", how="left")
        .with_columns(
            divergence_at=pl.when(pl.col("diverged")).then(pl.col("agree_to")),
            bitwise_prefix=pl.coalesce("bits_differ", "agree_to"),
            topk_order_changes=pl.col("topk_order_changes").fill_null(0),
            topk_set_changes=pl.col("topk_set_changes").fill_null(0),
            near_tie=((pl.col("reference_margin") >= 0.0) & (pl.col("reference_margin") < epsilon)).fill_null(False),
        )
    )
    return out.select([pl.col(name).cast(dtype) for name, dtype in COMPARISON_SCHEMA.items()]).sort("pair")


def _expm1(d: pl.Expr) -> pl.Expr:
    """``exp(d) - 1`` without the cancellation of ``exp(d) - 1`` for small d (k3 is second order in d); inf past float range."""
    return d.map_batches(_quiet_expm1, return_dtype=pl.Float64)


def _quiet_expm1(values: pl.Series) -> pl.Series:
    with np.errstate(over="ignore"):  # parity.k3 gives inf there too
        return pl.Series(values.name, np.expm1(values.cast(pl.Float64).to_numpy()))


def _topk_kl(steps: Steps, at: pl.DataFrame) -> pl.DataFrame:
    """``parity.topk_kl`` of the reference's list against the other's at each (pair, idx) of ``at``: ``pair``, ``idx``, ``kl``."""
    firsts = steps.firsts
    if steps.packed:  # packed keys: each candidate of the other's list found by one integer
        at = at.join(steps.steps.select(ref="req", idx="idx", ref_step="step"), on=["ref", "idx"]).join(
            steps.steps.select(other="req", idx="idx", other_step="step"), on=["other", "idx"]
        )
        # only the columns the sums need travel through the joins of every candidate (a few rows per step of every pair)
        joined = (
            at.select("pair", "idx", "ref_step", "other_step")
            .join(firsts.select(ref_step="step", ident="ident", p="prob"), on="ref_step")
            .select("pair", "idx", "p", key=pl.col("other_step") * _PACK + pl.col("ident"))
            .join(firsts.select("key", q="prob"), on="key", how="left")
        )
    else:
        joined = at.join(firsts.select(ref="req", idx="idx", ident="ident", p="prob"), on=["ref", "idx"]).join(
            firsts.select(other="req", idx="idx", ident="ident", q="prob"), on=["other", "idx", "ident"], how="left"
        )
    counted = (pl.col("p") > REST_FLOOR) & (pl.col("q") > 0.0)
    per_step = joined.group_by("pair", "idx").agg(
        missing=pl.col("q").null_count(),
        p_sum=pl.col("p").sum(),
        q_sum=pl.col("q").sum(),
        listed=(pl.col("p") * (pl.col("p") / pl.col("q")).log()).filter(counted).sum(),
        underflow=((pl.col("p") > REST_FLOOR) & (pl.col("q") <= 0.0)).any(),
    )
    p_rest = pl.max_horizontal(1.0 - pl.col("p_sum"), pl.lit(REST_FLOOR))
    q_rest = pl.max_horizontal(1.0 - pl.col("q_sum"), pl.lit(REST_FLOOR))
    rest = pl.when(p_rest > REST_FLOOR).then(p_rest * (p_rest / q_rest).log()).otherwise(0.0)
    return per_step.filter(pl.col("missing") == 0).select(
        "pair",
        "idx",
        kl=pl.when(pl.col("underflow"))
        .then(float("inf"))
        .otherwise(pl.max_horizontal(pl.col("listed") + rest, pl.lit(0.0))),
    )


def _at_divergence(steps: Steps, diverged: pl.DataFrame) -> pl.DataFrame:
    """Both margins and whether the other's token is in the reference's list, at each diverged pair's fork."""
    fork = diverged.select("pair", "ref", "other", idx=pl.col("agree_to"))
    ref = steps.steps.select(ref="req", idx="idx", reference_margin="margin", ref_n="n_cands", ref_list="cand_list")
    other = steps.steps.select(other="req", idx="idx", own_margin="margin", own_ident="ident")
    joined = fork.join(ref, on=["ref", "idx"], how="left").join(other, on=["other", "idx"], how="left")
    return joined.select(
        "pair",
        "reference_margin",
        "own_margin",
        in_reference_topk=pl.when(pl.col("ref_n") > 0).then(pl.col("ref_list").list.contains(pl.col("own_ident"))),
    )


# --- one stream and a band of streams -------------------------------------------------------------


def constant_runs(steps: Steps) -> pl.DataFrame:
    """``parity.longest_constant_run`` of every request: ``req``, ``max_constant_run`` (0 without tokens).

    Parameters
    ----------
    steps : Steps
        The requests' steps.

    Returns
    -------
    polars.DataFrame
    """
    runs = (
        steps.steps.select("req", run=pl.col("ident").rle_id().over("req"))
        .group_by("req", "run")
        .len()
        .group_by("req")
        .agg(max_constant_run=pl.col("len").max().cast(pl.Int64))
    )
    return (
        steps.requests.select("req")
        .join(runs, on="req", how="left")
        .with_columns(pl.col("max_constant_run").fill_null(0))
    )


def sequences(steps: Steps) -> pl.DataFrame:
    """Every request's whole completion as one list of identities: ``req``, ``sequence``.

    Parameters
    ----------
    steps : Steps
        The requests' steps.

    Returns
    -------
    polars.DataFrame
    """
    lists = steps.steps.group_by("req").agg(sequence=pl.col("ident").sort_by("idx"))
    out = steps.requests.select("req").join(lists, on="req", how="left")
    return out.with_columns(pl.col("sequence").fill_null(pl.lit([], dtype=out.schema["sequence"])))


def wilson(successes: pl.Expr, trials: pl.Expr, z: float = 1.959963984540054) -> tuple[pl.Expr, pl.Expr]:
    """``parity.wilson_interval`` as expressions: (low, high).

    Parameters
    ----------
    successes, trials : polars.Expr
        The counts.
    z : float, default 1.959963984540054
        The normal quantile (95%).

    Returns
    -------
    tuple of polars.Expr
    """
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * (p * (1 - p) / trials + z * z / (4 * trials * trials)).sqrt() / (1 + z * z / trials)
    return pl.max_horizontal(pl.lit(0.0), centre - half), pl.min_horizontal(pl.lit(1.0), centre + half)


def decode_rate(completion_tokens: pl.Expr, first: pl.Expr, last: pl.Expr, chunks: pl.Expr, live: pl.Expr) -> pl.Expr:
    """``parity.decode_rate`` as an expression: null where a rate cannot be measured.

    Parameters
    ----------
    completion_tokens : polars.Expr
        The request's completion tokens.
    first, last : polars.Expr
        The first and last content chunk's arrival, in seconds.
    chunks : polars.Expr
        How many content chunks came.
    live : polars.Expr
        Whether the stream is live (null: unknown, no rate).

    Returns
    -------
    polars.Expr
        Tokens per second.
    """
    measurable = (live.fill_null(False) & (completion_tokens >= 2) & (chunks >= 2) & (last > first)).fill_null(False)
    return pl.when(measurable).then((completion_tokens - 1) / (last - first)).cast(pl.Float64)


def band_rate(rates: pl.Expr) -> pl.Expr:
    """``parity.band_decode_rate`` as an aggregation: the median, null if any slot is untimed.

    Parameters
    ----------
    rates : polars.Expr
        The slots' decode rates.

    Returns
    -------
    polars.Expr
    """
    return pl.when((rates.null_count() == 0) & (rates.len() > 0)).then(rates.median())


def flip_bins(at_risk: pl.DataFrame, edges: Sequence[float]) -> pl.DataFrame:
    """P(flip | margin) per bin ``[edges[i], edges[i + 1])`` from steps at risk (``margin``, ``flip``).

    Parameters
    ----------
    at_risk : polars.DataFrame
        One row per step at risk: ``margin`` and ``flip``.
    edges : sequence of float
        The bins' edges, increasing.

    Returns
    -------
    polars.DataFrame
    """
    bins = pl.DataFrame(
        {"margin_low": [float(e) for e in edges[:-1]], "margin_high": [float(e) for e in edges[1:]]}
    ).with_row_index("bin")
    found = np.searchsorted(np.asarray(edges, dtype=float), at_risk["margin"].to_numpy(), side="right") - 1
    counted = (
        at_risk.with_columns(bin=pl.Series(found, dtype=pl.Int64))
        .filter((pl.col("bin") >= 0) & (pl.col("bin") < len(edges) - 1))
        .group_by("bin")
        .agg(steps=pl.len().cast(pl.Int64), flips=pl.col("flip").sum().cast(pl.Int64))
    )
    out = (
        bins.with_columns(pl.col("bin").cast(pl.Int64))
        .join(counted, on="bin", how="left", maintain_order="left")
        .with_columns(pl.col("steps", "flips").fill_null(0))
    )
    return out.select(
        "margin_low",
        "margin_high",
        "steps",
        "flips",
        p_flip=pl.when(pl.col("steps") > 0).then(pl.col("flips") / pl.col("steps")),
    )
