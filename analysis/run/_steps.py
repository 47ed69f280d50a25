"""A run's streams numbered for the columnar measures, with each request's reference: what the tables and the witness export share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from ..dumps import REQUEST_SCHEMA
from ..metrics import columnar as _columnar
from ..metrics import parity
from ._layout import RunError, RunLike

if TYPE_CHECKING:  # the tables take any object shaped like a Run (RunLike); only type hints name the class
    from ._model import Run


def _stream_of(streams: dict, row: Mapping[str, Any]) -> parity.Stream:
    return streams.get((row["source"], row["record"], row["choice_index"]), parity.Stream((row["source"],), ()))


def references(run: Run, reference: str | Run = "ref1") -> dict[str, parity.Stream]:
    """The reference stream of every prompt: ref #1 ("ref1") or ref #2 ("ref2") of this run, or ref #1 of another run.

    Parameters
    ----------
    run : Run
        The run.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        Which reference: ref #1 or ref #2 of this run, or ref #1 of another run's prompts.

    Returns
    -------
    dict of str to Stream
        Prompt id to its reference stream; a prompt without that reference has none.

    Raises
    ------
    RunError
        ``reference`` is another string.

    Examples
    --------
    >>> from analysis import assemble_run
    >>> references(assemble_run([{"source": "tests/samples/vllm_chat_nonstream_token_ids__OpenPipe-ART.json",
    ...                           "prompt_id": "p", "role": "reference", "slot": 0}]))["p"].identities[:2]
    (9707, 0)
    """
    if isinstance(reference, RunLike):
        return references(cast("Run", reference), "ref1")  # (mypy cannot rule out a str that is RunLike)
    if reference not in ("ref1", "ref2"):
        raise RunError(f"reference must be 'ref1', 'ref2' or another Run, got {reference!r}")
    if getattr(run, "pieces", None) is not None:
        return _streamed_references(run)[reference]
    slot = 0 if reference == "ref1" else 1
    streams = run.streams()
    refs = run.dump.requests.filter((pl.col("role") == "reference") & (pl.col("slot") == slot))
    return {row["prompt_id"]: _stream_of(streams, row) for row in refs.iter_rows(named=True)}


def _streamed_references(run: Run) -> dict[str, dict[str, parity.Stream]]:
    """A streamed run's ref #1 and ref #2 streams by prompt, from one pass over its pieces (a prompt's are in its
    piece), kept with the run: the engines' comparison asks for both."""
    if "reference_streams" not in run._cache:
        both: dict[str, dict[str, parity.Stream]] = {"ref1": {}, "ref2": {}}
        for piece in run.pieces:
            for which, streams in both.items():
                streams.update(references(piece, which))
        run._cache["reference_streams"] = both
    return run._cache["reference_streams"]


def numbered_steps(run: Run, reference: str | Run = "ref1") -> tuple[_columnar.Steps, pl.DataFrame, pl.DataFrame]:
    """The steps of the run's streams (and of a reference run's), its requests numbered (``req``, ``length``,
    ``decode_tok_s``), and each prompt's reference request (``prompt_id``, ``ref``).

    Parameters
    ----------
    run : Run
        The run.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        Each prompt's reference: ref #1 or ref #2 in this run, or ref #1 in another run.

    Returns
    -------
    tuple of (Steps, polars.DataFrame, polars.DataFrame)
    """
    if getattr(run, "pieces", None) is not None:  # a streamed run's tables are merged per piece; anything else collects
        run = run.collected()
    other = reference if isinstance(reference, RunLike) else None
    if other is not None and getattr(other, "pieces", None) is not None:
        other = cast(Any, other).collected()
    if other is None and reference not in ("ref1", "ref2"):
        raise RunError(f"reference must be 'ref1', 'ref2' or another Run, got {reference!r}")
    key = ("numbered", None if other is None else id(other))
    if key not in run._cache:
        dumps = [run.dump] if other is None else [run.dump, other.dump]
        steps = _columnar.build_steps([(d.tokens, d.candidates, d.requests) for d in dumps])
        numbered = [_numbered_requests(d.requests, steps, part) for part, d in enumerate(dumps)]
        run._cache[key] = (steps, numbered, other)  # holding ``other`` keeps its id from being reused
    steps, numbered, _ = run._cache[key]
    slot = 1 if reference == "ref2" else 0
    refs = (
        numbered[-1]
        .filter((pl.col("role") == "reference") & (pl.col("slot") == slot))
        .unique("prompt_id", keep="last", maintain_order=True)
        .select("prompt_id", ref="req", reference_text="completion_text")
    )
    return steps, numbered[0], refs


def _numbered_requests(requests: Any, steps: _columnar.Steps, part: int) -> pl.DataFrame:
    numbers = steps.requests.filter(pl.col("part") == part).drop("part")
    requests = parity.request_decode_rates(requests)
    # a pandas dump holds integer columns with gaps as floats: back to the schema's types
    requests = requests.with_columns(
        pl.col(name).cast(dtype) for name, dtype in REQUEST_SCHEMA.items() if name in requests.columns
    )
    return requests.join(numbers, on=["source", "record", "choice_index"], how="left", nulls_equal=True)


_BAND_ORDER = ["prompt_id", "arm", "c", "repeat", "slot"]


def _band_pairs(run: Run, reference: str | Run) -> tuple[_columnar.Steps, pl.DataFrame]:
    """Every batched request with its reference (``pair``, ``ref``, ``other``), in the tables' order. A request whose prompt
    has no such reference keeps a null ``ref``: it is unjudged (the judgement says which prompt), not an error."""
    steps, requests, refs = numbered_steps(run, reference)
    bands = (
        requests.filter(pl.col("role") == "band")
        .sort(_BAND_ORDER)
        .join(refs, on="prompt_id", how="left", maintain_order="left")
    )
    return steps, bands.with_row_index("pair").with_columns(pl.col("pair").cast(pl.Int64), other=pl.col("req"))


def with_evidence(steps: _columnar.Steps, compared: pl.DataFrame) -> pl.DataFrame:
    """Pairs (``pair``, ``ref``, ``other``, and the two completions' ``reference_text`` and ``completion_text``) with what
    their steps show as evidence (:func:`analysis.metrics.columnar.evidence_pairs`), ``has_reference``, and ``text_same``:
    whether the two message texts are equal, null unless both are non-empty.

    Parameters
    ----------
    steps : Steps
        The requests' steps.
    compared : polars.DataFrame
        The pairs, one row each, with the columns above (``ref`` null for a request whose prompt has no reference).

    Returns
    -------
    polars.DataFrame
        ``compared`` with :data:`analysis.metrics.columnar.EVIDENCE_SCHEMA`'s columns, ``has_reference`` and ``text_same``.
    """
    evidence = _columnar.evidence_pairs(
        steps, compared.filter(pl.col("ref").is_not_null()).select("pair", "ref", "other")
    )
    both = (pl.col("completion_text").str.len_bytes() > 0) & (pl.col("reference_text").str.len_bytes() > 0)
    return compared.join(evidence, on="pair", how="left", maintain_order="left").with_columns(
        has_reference=pl.col("ref").is_not_null(),
        text_same=pl.when(both).then(pl.col("completion_text") == pl.col("reference_text")),
        bits_known=pl.col("bits_known").fill_null(0),
    )
