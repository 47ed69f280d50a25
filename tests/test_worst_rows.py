"""The detail's long tables show their worst rows: the first rows of a stable sort (nulls last), found without sorting a
copy of every row, and a run's prompts sorted as Python sorts them, without a Python string per request."""

from __future__ import annotations

import re

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.dumps import Dump, read_dumps
from analysis.run import Run
from analysis.views.html.tables import worst_html

few = st.one_of(st.none(), st.integers(0, 3))  # many ties, and nulls


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(few, few, st.one_of(st.none(), st.floats(-2, 2, allow_nan=False))), max_size=40),
    n=st.integers(1, 12),
    descending=st.lists(st.booleans(), min_size=3, max_size=3),
)
def test_the_worst_rows_are_the_first_of_the_stable_sort_nulls_last(rows, n, descending):
    frame = pl.DataFrame(rows, schema={"a": pl.Int64, "b": pl.Int64, "x": pl.Float64}, orient="row").with_row_index("id")
    by = ["a", "b", "x"]
    expected = frame.sort(by, descending=descending, nulls_last=True, maintain_order=True).head(n)
    page = worst_html(frame, by=by, descending=descending, caption="c", what="rows", n=n)
    shown = [int(cell) for cell in re.findall(r"<tr><td>(\d+)</td>", page)]
    assert shown == expected["id"].to_list()


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(few, few, st.one_of(st.none(), st.floats(-2, 2, allow_nan=False))), max_size=40),
    n=st.integers(1, 12),
    descending=st.lists(st.booleans(), min_size=3, max_size=3),
)
def test_a_scan_keeps_the_same_first_rows(rows, n, descending):
    # issue 42: a scan's worst rows come from polars' streaming top-k (it holds n rows, not a sorted copy); ties keep
    # the scan's order, nulls come last in either direction, and the count is every row's
    from analysis.core import first_rows

    frame = pl.DataFrame(rows, schema={"a": pl.Int64, "b": pl.Int64, "x": pl.Float64}, orient="row").with_row_index("id")
    by = ["a", "b", "x"]
    expected = frame.sort(by, descending=descending, nulls_last=True, maintain_order=True).head(n)
    kept, height = first_rows(frame.lazy(), by, descending, n)
    page = worst_html(frame.lazy(), by=by, descending=descending, caption="c", what="rows", n=n)
    assert kept.equals(expected) and height == frame.height
    assert [int(cell) for cell in re.findall(r"<tr><td>(\d+)</td>", page)] == expected["id"].to_list()
    assert (f"of the {frame.height} rows not shown" in page) == (frame.height > n)


def test_a_runs_prompts_are_sorted_by_code_point_without_nulls():
    dump = read_dumps([])
    requests = pl.DataFrame({"prompt_id": ["p10", "p2", None, "é", "Z", "p2"]}, schema={"prompt_id": pl.String})
    run = Run({}, Dump(dump.tokens, dump.candidates, requests, {}, []))
    assert run.prompts == sorted({"p10", "p2", "é", "Z"}) == ["Z", "p10", "p2", "é"]
