"""What each request contributes to a verdict, decided once as columns the judgement only counts (``docs/verdicts.md``).

A request against ref #1 of its prompt is in exactly one state:

``no reference``  its prompt has no ref #1 (missing or refused): unjudged
``no evidence``   no token was compared: an empty or zero-length completion, on either side, with no message text to set
                  against the other's
``tokens``        a recorded difference in its tokens (a token that differs, a stream that ends while the other goes on),
                  or, with no tokens recorded, a message text that differs
``bits``          the same tokens, and a recorded value of a step (the sampled token's logprob or an alternative's) whose
                  bits differ at the precision recorded
``bits unknown``  the same tokens (or the same text) and no recorded difference, but a step whose logprob is null, NaN or
                  infinite on either side, alternatives listed on one side only, or no step to compare at all
``identical``     every token the same, every recorded value the same, bit for bit

Only ``identical`` can make GREEN; only ``tokens`` and ``bits`` make RED; every other state leaves the verdict
UNVERIFIED. Missing evidence can only make a verdict less certain, never greener.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

import polars as pl

from ..run import numbered_steps, piecewise

BATCHED_ARMS = ("copies", "mixed")  # the arms whose bands batch the prompt; the others are controls sent alone
# arms whose c=1 requests are the prompt alone and cold, as m=1 is; the serial arm sends every request alone at any c
ALONE_ARMS = ("copies", "mixed", "repeat")
SERIAL_ARM = "serial"

STATES = ("no reference", "no evidence", "tokens", "bits", "bits unknown", "identical")
# The slot-table columns a request's state is decided from (what _states reads): a reader that narrows a slot table
# before request_states keeps these.
STATE_COLUMNS = (
    "length",
    "reference_length",
    "has_reference",
    "text_same",
    "parted_at",
    "token_unknown_at",
    "bits_differ_at",
    "bits_unknown_at",
    "bits_known",
)

_ORDER = ["c", "prompt_id", "repeat", "slot"]


Frame = TypeVar("Frame", pl.DataFrame, pl.LazyFrame)


def _states(rows: Frame) -> Frame:
    """Each request against m=1 (rows of the slot or reference table) with its ``state`` and the flags the verdict counts:
    ``tokens_parted``, ``bits_parted``, ``bits_unknown``, ``no_evidence``, ``unjudged`` and ``position`` (the 0-based token
    where it parts; null when only its message text was compared)."""
    length, reference = pl.col("length").fill_null(0), pl.col("reference_length").fill_null(0)
    judged = pl.col("has_reference").fill_null(False)
    empty = judged & ((length == 0) | (reference == 0))
    recorded = judged & ~empty
    text = pl.col("text_same")
    token_parted = recorded & pl.col("parted_at").is_not_null()
    token_unknown = recorded & ~token_parted & pl.col("token_unknown_at").is_not_null()
    ended = recorded & ~token_parted & ~token_unknown & (length != reference)  # one ends while the other goes on
    tokens = token_parted | ended | (empty & ~text).fill_null(False)
    bits = recorded & ~tokens & pl.col("bits_differ_at").is_not_null()
    unknown = (
        ~tokens
        & ~bits
        & (
            token_unknown
            | (recorded & pl.col("bits_unknown_at").is_not_null())
            | (recorded & (pl.col("bits_known") == 0))
            | (empty & text.fill_null(False))
        )
    )
    no_evidence = empty & text.is_null()
    state = (
        pl.when(~judged)
        .then(pl.lit("no reference"))
        .when(tokens)
        .then(pl.lit("tokens"))
        .when(bits)
        .then(pl.lit("bits"))
        .when(no_evidence)
        .then(pl.lit("no evidence"))
        .when(unknown)
        .then(pl.lit("bits unknown"))
        .otherwise(pl.lit("identical"))
    )
    position = (
        pl.when(token_parted)
        .then("parted_at")
        .when(ended)
        .then(pl.min_horizontal(length, reference))
        .when(bits)
        .then("bits_differ_at")
    )
    return rows.with_columns(state=state).with_columns(
        tokens_parted=pl.col("state") == "tokens",
        bits_parted=pl.col("state") == "bits",
        bits_unknown=pl.col("state") == "bits unknown",
        no_evidence=pl.col("state") == "no evidence",
        unjudged=pl.col("state") == "no reference",
        position=position,
    )


def request_states(slots: Frame) -> Frame:
    """A slot table's requests, each with the state a verdict counts (``state``, its flags and ``position``), as
    :func:`analysis.judge` decides them: the one place a figure or card reads whether a request parts in tokens or bits.

    Parameters
    ----------
    slots : polars.DataFrame or polars.LazyFrame
        :func:`analysis.slot_table` of a run (or rows with its columns); a scan gives a scan.

    Returns
    -------
    polars.DataFrame or polars.LazyFrame
        The rows with ``state`` (one of ``STATES``), ``tokens_parted``, ``bits_parted``, ``bits_unknown``,
        ``no_evidence``, ``unjudged`` and ``position`` (the 0-based token where it parts).

    Examples
    --------
    >>> from analysis.run import read_run, slot_table
    >>> states = request_states(slot_table(read_run("data/experiment-cpu/default")))
    >>> sorted(states.filter(pl.col("c") > 1)["state"].unique())  # the same tokens, other logprob bits
    ['bits']
    """
    return _states(slots)


def part_counts(batched: pl.DataFrame | pl.LazyFrame) -> dict[str, int]:
    """How many of the batched requests (rows of :func:`request_states` with c > 1) part, and how: the counts a verdict's
    row carries and every figure of it restates.

    Parameters
    ----------
    batched : polars.DataFrame or polars.LazyFrame
        The batched requests with their states (a scan is counted a morsel at a time).

    Returns
    -------
    dict of str to int
        ``requests``, ``divergent`` (in tokens or bits), ``tokens_parted``, ``bits_only`` and ``bits_unknown``.

    Examples
    --------
    >>> part_counts(pl.DataFrame({"tokens_parted": [True, False, False], "bits_parted": [False, True, False],
    ...                           "bits_unknown": [False, False, True]}))
    {'requests': 3, 'divergent': 2, 'tokens_parted': 1, 'bits_only': 1, 'bits_unknown': 1}
    """
    counts = (
        batched.lazy()
        .select(
            requests=pl.len(),
            tokens_parted=pl.col("tokens_parted").sum(),
            bits_only=pl.col("bits_parted").sum(),
            bits_unknown=pl.col("bits_unknown").sum(),
        )
        .collect(engine="streaming")
        .row(0, named=True)
    )
    tokens, bits = int(counts["tokens_parted"]), int(counts["bits_only"])
    return {
        "requests": int(counts["requests"]),
        "divergent": tokens + bits,
        "tokens_parted": tokens,
        "bits_only": bits,
        "bits_unknown": int(counts["bits_unknown"]),
    }


def _alone_states(refs: pl.DataFrame, states: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """What the server does alone, run to run: each prompt's ref #2 against ref #1, then each request sent alone (c=1 of a
    batched arm or the repeat arm, and every request of the serial arm), in the order a reader is told of them (references
    first)."""
    columns = [
        "prompt_id",
        "c",
        "repeat",
        "slot",
        "role",
        "state",
        "tokens_parted",
        "bits_parted",
        "position",
        "max_ulp",
    ]
    second = _states(refs).select(
        "prompt_id",
        c=pl.lit(None, pl.Int64),
        repeat=pl.lit(None, pl.Int64),
        slot=pl.lit(1, pl.Int64),
        role=pl.lit("ref #2"),
        state="state",
        tokens_parted="tokens_parted",
        bits_parted="bits_parted",
        position="position",
        max_ulp="max_ulp",
    )
    alone = ((pl.col("c") == 1) & pl.col("arm").is_in(ALONE_ARMS)) | (pl.col("arm") == SERIAL_ARM)
    sent_alone = (
        states.lazy()
        .filter(alone)
        .sort(_ORDER)
        .select(
            "prompt_id",
            c="c",
            repeat="repeat",
            slot="slot",
            role=pl.format("{} c={}", "arm", "c"),
            state="state",
            tokens_parted="tokens_parted",
            bits_parted="bits_parted",
            position="position",
            max_ulp="max_ulp",
        )
        .collect(engine="streaming")
    )
    return pl.concat([second.sort("prompt_id").select(columns), sent_alone.select(columns)], how="vertical_relaxed")


def _formation(bands: pl.DataFrame) -> pl.DataFrame:
    """Each band with ``widest_seen`` and ``formed``: c = 1, or the strongest width evidence present shows a batch of c
    (``m_formed``: the server's per-step log, then its gauge or counters, then live streams). ``contradicted``: the server's
    own per-step record (``log``, exact) shows less than c while a weaker kind (``width_evidence``'s others) shows c; the
    gauge and the counters are lower bounds, which a wider figure of a weaker kind does not contradict."""
    others = pl.col("width_evidence").str.extract_all(r"\d+").list.eval(pl.element().cast(pl.Int64)).list.max()
    seen = pl.col("m_formed")
    formed = (pl.col("c") <= 1) | (seen >= pl.col("c")).fill_null(False)
    exact = pl.col("width_evidence").str.starts_with("log").fill_null(False)
    contradicted = ~formed & exact & (others >= pl.col("c")).fill_null(False)
    return bands.with_columns(widest_seen=seen, formed=formed, contradicted=contradicted)


_PLACES = {
    "prompt_id": pl.String,
    "role": pl.String,
    "c": pl.Int64,
    "slot": pl.Int64,
    "repeat": pl.Int64,
    "arm": pl.String,
}


def refused_requests(manifest: Mapping[str, Any], legacy_arm: str) -> pl.DataFrame:
    """The requests a probe sent that the server refused or failed (the manifest's ``refused`` list), one row each with
    ``reason``: evidence missing, never a request that agrees.

    Parameters
    ----------
    manifest : Mapping of str to Any
        The run's manifest.
    legacy_arm : str
        The arm of a refused request that names none (a run made before arms).

    Returns
    -------
    polars.DataFrame
        ``prompt_id``, ``role``, ``c``, ``slot``, ``repeat``, ``arm`` and ``reason``.

    Examples
    --------
    >>> refused_requests({"refused": [{"prompt_id": "p0", "role": "band", "c": 4, "slot": 2, "repeat": 0, "reason": "HTTP 503"}]},
    ...                  "copies").select("c", "slot", "arm", "reason").row(0)
    (4, 2, 'copies', 'HTTP 503')
    """
    rows = [
        {
            "prompt_id": None if entry.get("prompt_id") is None else str(entry.get("prompt_id")),
            "role": entry.get("role"),
            "c": entry.get("c"),
            "slot": entry.get("slot"),
            "repeat": entry.get("repeat"),
            "arm": entry.get("arm") or ("reference" if entry.get("role") == "reference" else legacy_arm),
            "reason": str(entry.get("reason") or "refused"),
        }
        for entry in manifest.get("refused") or []
        if isinstance(entry, Mapping)
    ]
    return pl.DataFrame(rows, schema={**_PLACES, "reason": pl.String}, orient="row")


def missing_frame(missing: list[dict[str, Any]]) -> pl.DataFrame:
    """``Run.missing``'s rows as a frame.

    Parameters
    ----------
    missing : list of dict
        ``Run.missing()``'s rows.

    Returns
    -------
    polars.DataFrame
        ``prompt_id``, ``role``, ``c``, ``slot``, ``repeat``, ``arm`` and ``state``.
    """
    return pl.DataFrame(missing, schema={**_PLACES, "state": pl.String}, orient="row")


_WIDEST = ("float64", "float32", "none")  # a precision merged over a run's pieces: the widest any of them recorded


def widest_precision(table: pl.DataFrame) -> str:
    """The widest precision among a precision table's rows ("none" when it has none).

    Parameters
    ----------
    table : polars.DataFrame
        Rows of :func:`precision_table`.

    Returns
    -------
    str

    Examples
    --------
    >>> widest_precision(pl.DataFrame({"precision": ["none", "float32"]}))
    'float32'
    """
    found = set(table["precision"].to_list())
    return next((p for p in _WIDEST if p in found), "none")


@piecewise("precision", merge=lambda rows: pl.DataFrame({"precision": [widest_precision(rows)]}))
def precision_table(run: Any) -> pl.DataFrame:
    """The precision a run's (or a piece's) logprobs were recorded at, one row (:func:`precision_compared`); a run
    read a piece at a time has a row per piece, and :func:`widest_precision` merges them.

    Parameters
    ----------
    run : Run
        The run or piece.

    Returns
    -------
    polars.DataFrame
        One ``precision`` row.

    Examples
    --------
    >>> from analysis import read_run
    >>> precision_table(read_run("data/experiment-cpu/default"))["precision"].to_list()
    ['float32']
    """
    return pl.DataFrame(
        {"precision": [precision_compared(numbered_steps(run)[0].steps["logprob"])]}, schema={"precision": pl.String}
    )


def precision_compared(logprobs: pl.Series) -> str:
    """The precision the run's logprobs were compared at, as recorded: ``float32`` when every finite one is a float32 (a
    server that computes in float32 and writes it out), ``float64`` when any holds more bits, ``none`` with none recorded.

    Parameters
    ----------
    logprobs : polars.Series
        The run's recorded logprobs.

    Returns
    -------
    str

    Examples
    --------
    >>> precision_compared(pl.Series([-0.5, -0.25])), precision_compared(pl.Series([-0.5, -0.25 - 1e-9]))
    ('float32', 'float64')
    >>> precision_compared(pl.Series([None, float("nan")], dtype=pl.Float64))
    'none'
    """
    finite = logprobs.cast(pl.Float64).filter(logprobs.cast(pl.Float64).is_finite())
    if finite.is_empty():
        return "none"
    return "float32" if (finite.cast(pl.Float32).cast(pl.Float64) == finite).all() else "float64"


_GREW = re.compile(r"(?:cached|cache_hits?)[\w:]*\s\+(\d+(?:\.\d+)?)")


def cache_served_in(bands: pl.DataFrame) -> bool:
    """Whether any band of a band table shows its cache counters grew (:func:`_cache_served`).

    Parameters
    ----------
    bands : polars.DataFrame
        A band table (its ``prefix_cache`` column).

    Returns
    -------
    bool

    Examples
    --------
    >>> cache_served_in(pl.DataFrame({"prefix_cache": [None, "llamacpp:prompt_tokens_cached +12"]}))
    True
    """
    text = " ".join(filter(None, bands["prefix_cache"].to_list()))
    return any(float(n) > 0 for n in _GREW.findall(text))
