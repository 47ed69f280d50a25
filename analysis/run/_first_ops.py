"""The first op that differs, as an experiment run records it in ``first_ops.json`` (see
:func:`analysis.experiment.write_first_ops`): read, checked and served as a table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from ._layout import RunError

if TYPE_CHECKING:  # the tables take any object shaped like a Run (RunLike); only type hints name the class
    from ._model import Run

FIRST_OPS_FILE = "first_ops.json"
_COLUMNS = {
    "prompt_id": pl.String,
    "c": pl.Int64,
    "slot": pl.Int64,
    "step": pl.Int64,
    "layer": pl.Int64,
    "op": pl.String,
}
_SCHEMA = {**_COLUMNS, "op_index": pl.Int64, "onset": pl.Boolean}


def has_first_ops(run: Run) -> bool:
    """Whether the run's directory holds a ``first_ops.json`` (an experiment run replayed with taps).

    Parameters
    ----------
    run : Run
        The run.

    Returns
    -------
    bool
        False for an assembled run, which has no directory.
    """
    return run.path is not None and (run.path / FIRST_OPS_FILE).is_file()


def first_ops_record(run: Run) -> dict[str, Any]:
    """``first_ops.json`` checked: its ops in forward order (``ops``, a list of (layer, op)), whether the
    mode's kernels were tapped (``tapped``) and the steps as a frame (``steps``); read once per run.

    Parameters
    ----------
    run : Run
        The run.

    Returns
    -------
    dict
        ``ops``, ``tapped``, ``kernel_mode`` (as the record names it, or None) and ``steps``.

    Raises
    ------
    RunError
        The run has no ``first_ops.json``, or it is not a version 1 record.
    """
    if "first_ops" in run._cache:
        return run._cache["first_ops"]
    if not has_first_ops(run):
        where = run.path / FIRST_OPS_FILE if run.path is not None else "an assembled run"
        raise RunError(
            f"{where}: no first-op record; an experiment run gets one from analysis.experiment.write_first_ops "
            "(bia experiment writes it)"
        )
    path = cast(Path, run.path) / FIRST_OPS_FILE  # has_first_ops: the run has a folder
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunError(f"{path}: not readable as JSON: {exc}") from None
    if not isinstance(record, dict) or record.get("first_ops_version") not in (1, 2):
        raise RunError(
            f"{path}: field first_ops_version: expected 1 or 2, got {record.get('first_ops_version') if isinstance(record, dict) else record!r}"
        )
    legacy = record["first_ops_version"] == 1 and isinstance(record.get("steps"), dict) and "band_c" in record["steps"]
    if legacy:
        record["steps"] = {
            ("c" if name == "band_c" else name): values for name, values in record["steps"].items()
        }  # legacy key of version 1
    ops = _ops(path, record.get("ops"))
    run._cache["first_ops"] = {
        "ops": ops,
        "tapped": record.get("tapped") is True,
        "kernel_mode": record.get("kernel_mode"),
        "steps": _steps(path, record.get("steps"), ops),
    }
    return run._cache["first_ops"]


def _ops(path, ops: Any) -> list[tuple[int | None, str]]:
    if not isinstance(ops, list):
        raise RunError(f"{path}: field ops: expected a list of {{layer, op}}, got {type(ops).__name__}")
    out = []
    for i, entry in enumerate(ops):
        layer, op = (entry.get("layer"), entry.get("op")) if isinstance(entry, dict) else (None, None)
        if not isinstance(op, str) or not (layer is None or (isinstance(layer, int) and not isinstance(layer, bool))):
            raise RunError(f"{path}: ops record {i}: expected {{'layer': int or null, 'op': str}}, got {entry!r}"[:300])
        out.append((layer, op))
    return out


def _steps(path, steps: Any, ops: list[tuple[int | None, str]]) -> pl.DataFrame:
    """The steps' columns as a frame, each value of its column's type and each (layer, op) one of ``ops``."""
    if not isinstance(steps, dict) or set(steps) != set(_COLUMNS):
        raise RunError(
            f"{path}: field steps: expected the columns {', '.join(_COLUMNS)}, got "
            f"{sorted(steps) if isinstance(steps, dict) else type(steps).__name__}"
        )
    lengths = {name: len(values) if isinstance(values, list) else None for name, values in steps.items()}
    if None in lengths.values() or len(set(lengths.values())) != 1:
        raise RunError(f"{path}: field steps: every column must be a list of one length, got lengths {lengths}")
    frame = pl.DataFrame([_column(path, name, steps[name], dtype) for name, dtype in _COLUMNS.items()]).with_row_index(
        "record"
    )
    order = pl.DataFrame(
        {"layer": [layer for layer, _ in ops], "op": [op for _, op in ops]}, schema={"layer": pl.Int64, "op": pl.String}
    )
    frame = frame.join(
        order.with_row_index("op_index").with_columns(pl.col("op_index").cast(pl.Int64)),
        on=["layer", "op"],
        how="left",
        nulls_equal=True,
        maintain_order="left",
    )
    unknown = frame.filter(pl.col("op").is_not_null() & pl.col("op_index").is_null())
    if unknown.height:
        bad = unknown.row(0, named=True)
        raise RunError(
            f"{path}: steps record {bad['record']}: field op: layer {bad['layer']} op {bad['op']!r} is not one of the file's ops"
        )
    return frame.drop("record")


def _column(path, name: str, values: list, dtype) -> pl.Series:
    """One column of the steps, strictly of its type (null only for layer and op); the error names the first bad record."""
    try:  # the type inferred, not imposed: a float or a bool is not cast to an integer
        column = pl.Series(name, values, strict=True)
    except (TypeError, ValueError, pl.exceptions.PolarsError):
        column = None
    if (
        column is not None
        and column.dtype in (dtype, pl.Null)
        and (name in ("layer", "op") or column.null_count() == 0)
    ):
        return column.cast(dtype)
    wanted = str if dtype == pl.String else int
    # only on the error path: find the record to name
    i, value = next(
        (i, v)
        for i, v in enumerate(values)
        if not (v is None and name in ("layer", "op")) and (not isinstance(v, wanted) or isinstance(v, bool))
    )
    raise RunError(f"{path}: steps record {i}: field {name}: expected {wanted.__name__}, got {value!r}"[:300])


def first_op_table(run: Run) -> pl.DataFrame:
    """One row per batched decode step that differs from m=1: the first op, in forward order, whose output differs.

    An experiment run replayed with taps on every op (``first_ops.json``, written by ``bia
    experiment``) records, for each step whose token, logprob or top-k differ bit for bit from the
    same prompt decoded alone, the first op whose output differs from the same step alone: ``layer``
    (null for the embedding, the final norm, the logits and ``logprobs``) and ``op``, with
    ``op_index`` its place in forward order. ``onset`` marks each request's first differing step:
    where its drift starts; later steps also carry what earlier ones changed. ``op`` is null in a
    kernel mode whose kernels have no taps. A batch-invariant mode has no row.

    Parameters
    ----------
    run : Run
        An experiment run with its ``first_ops.json``.

    Returns
    -------
    polars.DataFrame
        ``prompt_id``, ``c``, ``slot``, ``step``, ``layer``, ``op``, ``op_index``, ``onset``,
        sorted by request and step.

    Raises
    ------
    RunError
        The run has no ``first_ops.json``, or a field of it is malformed (named with its record).

    Examples
    --------
    >>> from analysis import read_run
    >>> table = first_op_table(read_run("data/experiment-cpu/default"))
    >>> table.filter(pl.col("onset")).group_by("layer", "op").len().rows()
    [(0, 'qkv', 56)]
    >>> first_op_table(read_run("data/experiment-cpu/fixed-tiles")).height
    0
    """
    steps = first_ops_record(run)["steps"]
    request = ["prompt_id", "c", "slot"]
    return (
        steps.sort([*request, "step"])
        .with_columns(onset=pl.col("step") == pl.col("step").min().over(request))
        .select([pl.col(n).cast(t) for n, t in _SCHEMA.items()])
    )
