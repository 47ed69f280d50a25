"""The per-token pass of the mismatch metrics: every per-sequence sum and batch-wide moment in one read of the tokens.

polars' streaming engine reads the few columns the metrics need (the sequence key, the loss mask,
the two logprobs, the advantage and the support flag when there are ones) in batches; each batch is
cut into blocks of :data:`BLOCK_ROWS` rows, and numpy computes on a block's loss-masked tokens
(:func:`~analysis.metrics.mismatch._mismatch_block_sums.block_sums`) every per-token quantity once
(``δ``, ``ρ``, ``exp t``, ``exp r``, K3...) into the rows of one array and reduces them at once: per run of equal ``sequence`` with ``numpy.add.reduceat``, batch-wide with
sums, two-pass second moments, a co-moment, maxima and minima. A block's twenty-odd float64 rows
stay in a core's cache, which is what makes the pass cheap: measured on 10 M token rows of
``benchmarks/bench_mismatch.py``'s data, the same operations on 1 M-row blocks took three times the
CPU time (and numpy's ``exp`` over a cached block is ten times as fast as polars'); with the thirty
per-token polars expressions this pass replaces, the summary took 16x the bare scan of the two
logprob columns, and now about 5x. The blocks of the batches in flight run on a thread per core:
numpy releases the GIL inside its loops. Where numba is installed (the ``fast`` extra) the same sums
come from one compiled loop instead (:mod:`~analysis.metrics.mismatch._mismatch_kernel`, :data:`COMPILED`),
which releases the GIL too; this numpy pass is the fallback and the reference the tests compare it with.

A sequence cut across blocks or batches gets one partial row per piece, which
:func:`~analysis.metrics.mismatch._mismatch.merge_sequences` adds; the blocks' batch-wide rows merge with
:func:`~analysis.metrics.mismatch._mismatch.merge_globals`.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import polars as pl
import pyarrow as pa

from ._mismatch import ADV_SUMS, SEQ_SUMS, Constants, merge_globals, merge_sequences
from ._mismatch_block_sums import _MOMENT_ROWS, ROW_FIELDS, _batch_row, block_sums, run_fields

#: Rows per numpy block: a block's twenty-odd float64 rows (16 Ki x 8 bytes = 128 KiB each) stay in a core's L2 cache.
BLOCK_ROWS = 1 << 14

#: Whether the per-token pass runs compiled (numba, :mod:`~analysis.metrics.mismatch._mismatch_kernel`) where numba is installed;
#: False runs the numpy pass (the tests compare the two).
COMPILED = True

#: The per-sequence sums that count tokens, stored as Int64.
_COUNTS = frozenset(name for name in (*SEQ_SUMS, *ADV_SUMS) if not name.startswith("s_"))


def token_columns(tokens: pl.LazyFrame, *, advantage: bool = False) -> pl.LazyFrame:
    """The columns the per-token pass reads, in the types it reads them.

    ``mask`` becomes a boolean with null read as False, and so does ``has_support``, present only
    when ``tokens`` has it (the compiled pass reads their bits where they lie). ``r`` and ``t`` are the rollout and trainer
    logprobs with null read as NaN (a loss-masked token without a logprob then makes its sequence's
    sums NaN, which the caller names), as float32 where they are float32 (numpy widens a block's
    loss-masked ones, exactly, which costs less than widening every row here) and float64 otherwise.

    Parameters
    ----------
    tokens : polars.LazyFrame
        The token frame.
    advantage : bool, default False
        Also read ``advantage``.

    Returns
    -------
    polars.LazyFrame

    Examples
    --------
    >>> tokens = pl.LazyFrame({"sequence": [0, 0], "rollout_logprob": [-0.1, None],
    ...                        "trainer_logprob": [-0.12, None], "mask": [True, None]})
    >>> token_columns(tokens).collect().rows()
    [(0, True, -0.1, -0.12), (0, False, nan, nan)]
    """
    schema = tokens.collect_schema()

    def real(name: str) -> pl.Expr:
        return pl.col(name).cast(pl.Float32 if schema[name] == pl.Float32 else pl.Float64)

    logprob = {"r": "rollout_logprob", "t": "trainer_logprob"}
    names = schema.names()
    return tokens.select(
        "sequence",
        pl.col("mask").cast(pl.Boolean).fill_null(False),
        *(real(name).fill_null(float("nan")).alias(short) for short, name in logprob.items()),
        *([real("advantage")] if advantage else []),
        *([pl.col("has_support").cast(pl.Boolean).fill_null(False)] if "has_support" in names else []),
    )


def _run_starts(batch: pl.DataFrame) -> np.ndarray:
    """The rows where a run of equal ``sequence`` starts (any key type, nulls equal to each other)."""
    key = pl.col("sequence")
    return np.flatnonzero(batch.select(key.ne_missing(key.shift(1)).fill_null(True)).to_series().to_numpy())


def partials(
    tokens: pl.LazyFrame, c: Constants = Constants(), *, advantage: bool = False, chunk_size: int = 1_000_000
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per-sequence sums and the batch-wide row of a token frame, read in batches with polars' streaming engine.

    ``tokens`` has ``sequence``, ``rollout_logprob``, ``trainer_logprob``, ``mask``, ``advantage``
    when ``advantage`` is set, and optionally ``has_support``. Sequences come out in first-seen order.

    Parameters
    ----------
    tokens : polars.LazyFrame
        The token frame.
    c : Constants, default Constants()
        The frameworks' constants.
    advantage : bool, default False
        Read ``advantage`` and sum prime-rl's quantities.
    chunk_size : int, default 1_000_000
        Rows per streamed batch.

    Returns
    -------
    tuple of polars.DataFrame
        The per-sequence sums and the batch-wide row.

    Examples
    --------
    >>> tokens = pl.LazyFrame({"sequence": [0, 0], "rollout_logprob": [-0.1, -2.0],
    ...                        "trainer_logprob": [-0.12, -1.9], "mask": [True, True]})
    >>> seqs, glob = partials(tokens)
    >>> seqs["n"].item(), round(seqs["s_d"].item(), 6), round(glob["max_absd"].item(), 6)
    (2, 0.08, 0.1)
    """
    return next(iter(piece_partials([(tokens, advantage)], c, chunk_size=chunk_size)))


def piece_partials(
    pieces: Iterable[tuple[pl.LazyFrame, bool]], c: Constants = Constants(), *, chunk_size: int = 1_000_000
) -> list[tuple[pl.DataFrame, pl.DataFrame]]:
    """:func:`partials` of each ``(tokens, advantage)`` piece, in order, the pieces read one after another in one pipeline.

    The threads never wait at a piece's end: while the last batches of one piece are summed, polars
    already reads the next piece's (each piece on its own would leave a core idle at its end).

    Parameters
    ----------
    pieces : iterable of tuple of (polars.LazyFrame, bool)
        Each piece's token frame, and whether it has an advantage.
    c : Constants, default Constants()
        The frameworks' constants.
    chunk_size : int, default 1_000_000
        Rows per streamed batch.

    Returns
    -------
    list of tuple of polars.DataFrame

    Examples
    --------
    >>> tokens = pl.LazyFrame({"sequence": [0, 0, 1], "rollout_logprob": [-0.1, -2.0, -0.5],
    ...                        "trainer_logprob": [-0.12, -1.9, -0.5], "mask": [True, True, True]})
    >>> [seqs["n"].to_list() for seqs, _ in piece_partials([(tokens.head(2), False), (tokens.tail(1), False)])]
    [[2], [1]]
    """
    pieces = list(pieces)
    collected: list[tuple[list, list, list]] = [([], [], []) for _ in pieces]  # each piece's batches' keys, runs, rows
    outstanding = [0] * len(pieces)  # each piece's batches submitted and not yet collected
    read = [False] * len(pieces)  # each piece's batches all submitted
    merged: list = [None] * len(pieces)  # each piece's _merged, a future submitted once it is read and summed whole
    # numpy and the compiled pass release the GIL inside their loops: the batches' blocks run on all cores while
    # polars reads the next batches, a bounded number in flight; polars' own buffer holds a few more per query
    workers = os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=workers) as pool:

        def merge_when_whole(index: int) -> None:  # merged on a worker while the later pieces are read, not after all
            if read[index] and not outstanding[index]:
                merged[index] = pool.submit(_merged, *pieces[index], *collected[index], c)

        def collect(index: int, future) -> None:
            _collect(future.result(), *collected[index])
            outstanding[index] -= 1
            merge_when_whole(index)

        warm = None
        if pieces:  # numba's first use in a process (~0.3 s) while polars starts reading, not after its first batch
            warm = pool.submit(_warm_up, token_columns(pieces[0][0], advantage=pieces[0][1]).collect_schema(), c)

        def batches(index: int):  # polars starts the query at once and reads ahead of the consumer (a bounded buffer)
            if index < len(pieces):
                tokens, advantage = pieces[index]
                return token_columns(tokens, advantage=advantage).collect_batches(
                    chunk_size=chunk_size, engine="streaming"
                )
            return None

        pending: deque = deque()
        upcoming = batches(0)
        for index in range(len(pieces)):
            # the next piece's query starts as this one's begins, so that its first batches are read by the time this
            # one ends: a query started then left the cores idle while it opened its file, at each of 20 pieces
            current, upcoming = upcoming, batches(index + 1)
            for batch in current:
                pending.append((index, pool.submit(_batch_sums, batch, c)))
                outstanding[index] += 1
                while len(pending) > workers:
                    collect(*pending.popleft())
            read[index] = True
            merge_when_whole(index)
        while pending:
            collect(*pending.popleft())
        if warm is not None:
            warm.result()  # a warm-up that failed says so, rather than leaving the pass only slower
        return [future.result() for future in merged]


def _merged(
    tokens: pl.LazyFrame, advantage: bool, keys: list, runs: list, rows: list, c: Constants
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One piece's merged per-sequence sums and batch-wide row from its batches' keys, runs and rows."""
    fields = run_fields(advantage)
    key_dtype = token_columns(tokens).collect_schema()["sequence"]
    sums = np.concatenate(runs, axis=1) if runs else np.zeros((len(fields), 0))
    seqs = pl.DataFrame(
        {"sequence": pl.concat(keys) if keys else pl.Series([], dtype=key_dtype), **dict(zip(fields, sums))}
    )
    seqs = seqs.select(
        "sequence",
        *(
            pl.col(name).cast(pl.Int64) if name in _COUNTS else pl.col(name)
            for name in (*SEQ_SUMS, *ADV_SUMS)
            if name in fields
        ),
    )
    if not rows:  # no token: one empty block's row
        rows = [_batch_row(np.zeros((len(_MOMENT_ROWS), 0)), np.zeros(0), c)]
    glob = pl.DataFrame(
        np.concatenate([np.atleast_2d(r) for r in rows]), schema=list(ROW_FIELDS), orient="row"
    ).with_columns(pl.col("n").cast(pl.Int64), pl.col("^(max|min)_.*$").fill_nan(None))  # no masked token: no extreme
    return merge_sequences(seqs), merge_globals(glob)


def _warm_up(schema: pl.Schema, c: Constants) -> None:
    """Sum one token of ``schema``'s types, so that the compiled pass is loaded (numba's first use in a process) while
    polars starts reading; a key that is not an integer takes the general path, as a string.

    Examples
    --------
    >>> _warm_up(pl.Schema({"sequence": pl.Categorical(), "mask": pl.Boolean, "r": pl.Float32, "t": pl.Float32}), Constants())
    """

    def zero(name: str, dtype: pl.DataType) -> pl.Expr:
        if name == "sequence" and not dtype.is_integer():
            return pl.lit("0")
        return pl.lit(0).cast(dtype)

    _batch_sums(pl.select(*(zero(name, dtype).alias(name) for name, dtype in schema.items())), c)


def _collect(result, keys: list, runs: list, rows: list) -> None:
    if result is not None:
        keys.append(result[0])
        runs.append(result[1])
        rows.append(result[2])


#: The per-token columns the pass reads besides the sequence key, in the order the block functions take them.
_INPUTS = ("mask", "r", "t", "advantage", "has_support")


def _numpy_columns(batch: pl.DataFrame) -> dict[str, np.ndarray]:
    return {name: batch[name].to_numpy() for name in _INPUTS if name in batch.columns}


_Column = TypeVar("_Column")


def _inputs(columns: Mapping[str, _Column]) -> tuple[_Column, _Column, _Column, _Column | None, _Column | None]:
    """The :data:`_INPUTS` of ``columns`` in order, as the block functions take them: ``mask``, ``r`` and ``t`` always
    there (:func:`token_columns`), ``advantage`` and ``has_support`` None where absent."""
    return columns["mask"], columns["r"], columns["t"], columns.get("advantage"), columns.get("has_support")


def _batch_sums(batch: pl.DataFrame, c: Constants) -> tuple[pl.Series, np.ndarray, np.ndarray] | None:
    """A batch's run keys, per-run sums and batch-wide rows, one of each per block of :data:`BLOCK_ROWS` rows."""
    if not batch.height:
        return None
    from . import _mismatch_kernel  # imports numba, where installed: only when there are tokens to sum

    if COMPILED and _mismatch_kernel.AVAILABLE:
        return _compiled_sums(batch, c)
    columns = _numpy_columns(batch)
    starts = _run_starts(batch)
    firsts, runs, rows = [], [], []  # each block's first row starts a run (a piece of one), besides the batch's own
    for begin in range(0, batch.height, BLOCK_ROWS):
        end = min(begin + BLOCK_ROWS, batch.height)
        block_starts = np.concatenate(
            ([begin], starts[np.searchsorted(starts, begin, "right") : np.searchsorted(starts, end)])
        )
        block = {name: column[begin:end] for name, column in columns.items()}
        run, row = block_sums(block_starts - begin, *_inputs(block), c)
        firsts.append(block_starts)
        runs.append(run)
        rows.append(row)
    return batch["sequence"].gather(np.concatenate(firsts)), np.concatenate(runs, axis=1), np.stack(rows)


def _compiled_sums(batch: pl.DataFrame, c: Constants) -> tuple[pl.Series, np.ndarray, np.ndarray]:
    """:func:`_batch_sums` in one compiled loop: the same runs (a block's first row starts one) and the same block rows."""
    from . import _mismatch_kernel

    key = batch["sequence"]
    sizes = len(run_fields("advantage" in batch.columns)), len(ROW_FIELDS)
    if not key.dtype.is_integer() or key.null_count():  # any other key: polars finds where it changes
        columns = _numpy_columns(batch)
        firsts = np.union1d(_run_starts(batch), np.arange(0, batch.height, BLOCK_ROWS))
        firsts, runs, rows = _mismatch_kernel.batch_sums(None, firsts, BLOCK_ROWS, *_inputs(columns), c, *sizes)
        return key.gather(firsts), runs, rows
    # An integer key: each of the batch's Arrow chunks as it lies in memory, its blocks counted from the chunk's
    # start (a batch of several chunks, as the streaming engine gives, is otherwise copied whole into one array per
    # column first: a tenth of the pass's time), the loop finding the runs on the key's own buffer.
    keys: list[np.ndarray] = []
    run_parts: list[np.ndarray] = []
    row_parts: list[np.ndarray] = []
    for chunk in batch.to_arrow().to_batches():
        if not chunk.num_rows:
            continue
        names = chunk.schema.names
        # numpy arrays, a boolean's as Bits (see _chunk_array): Any, as which is which follows from the column
        arrays: dict[str, Any] = {
            name: _chunk_array(chunk.column(name)) for name in ("sequence", *_INPUTS) if name in names
        }
        f, r, w = _mismatch_kernel.batch_sums(arrays["sequence"], None, BLOCK_ROWS, *_inputs(arrays), c, *sizes)
        keys.append(arrays["sequence"][f])  # numpy's gather: polars' Series.gather runs a query (0.4 ms a batch)
        run_parts.append(r)
        row_parts.append(w)
    return pl.Series("sequence", np.concatenate(keys)), np.concatenate(run_parts, axis=1), np.concatenate(row_parts)


def _chunk_array(array: pa.Array) -> np.ndarray | tuple[np.ndarray, int]:
    """An Arrow array as the compiled pass reads it, without a copy where it has no null: a number's buffer as numpy,
    a boolean's bitmap with the bit of its row 0 (``_mismatch_kernel.Bits``); nulls take pyarrow's way (a float's
    become NaN).

    pyarrow's own ``to_numpy`` takes longer for the same view, on the streaming engine's thousand chunks per 100 M
    rows, and unpacks booleans into new memory per chunk, which cost more than the compiled pass itself in page faults.

    Examples
    --------
    >>> _chunk_array(pa.array([1.5, 2.5, 3.5], pa.float32()).slice(1)).tolist()
    [2.5, 3.5]
    >>> _chunk_array(pa.array([1.5, None])).tolist()
    [1.5, nan]
    >>> packed, offset = _chunk_array(pa.array([True, False, True, True]).slice(1))
    >>> [bool(packed[(offset + i) // 8] >> ((offset + i) % 8) & 1) for i in range(3)]
    [False, True, True]
    >>> _chunk_array(pa.array(["a", "b"])).tolist()  # any other type: pyarrow's way
    ['a', 'b']
    """
    if not array.null_count and pa.types.is_boolean(array.type):
        return np.frombuffer(array.buffers()[1], dtype=np.uint8), array.offset
    if array.null_count or not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)):
        return array.to_numpy(zero_copy_only=False)
    return np.frombuffer(array.buffers()[1], dtype=array.type.to_pandas_dtype(), count=array.offset + len(array))[
        array.offset :
    ]
