"""The plain, per-stream run tables that bia computed before its metrics became polars queries: a
loop over requests with :func:`analysis.parity.compare` per pair. ``test_columnar.py`` checks the
columnar tables in :mod:`analysis.run` against these on random streams."""

from __future__ import annotations

import numpy as np
import polars as pl

from analysis import parity
from analysis.run import Run, band_widths
from analysis.run._band_tables import _release_skew, _seconds_per_1000, _send_spans
from analysis.run._layout import _cache_summary

BAND_ORDER = ["prompt_id", "c", "repeat", "slot"]


def streams(run: Run) -> dict[tuple, parity.Stream]:
    return parity.streams(run.dump.tokens, run.dump.candidates)


def stream_of(all_streams: dict, row: dict) -> parity.Stream:
    return all_streams.get((row["source"], row["record"], row["choice_index"]), parity.Stream((row["source"],), ()))


def requests(run: Run) -> pl.DataFrame:
    """The requests with a decode rate per row, by :func:`analysis.parity.decode_rate`."""
    rows = run.dump.requests
    rates = [parity.decode_rate(r["completion_tokens"], r["ttft_s"], r["t_last_content"], r["n_content_chunks"], r["stream_live"])
             for r in rows.iter_rows(named=True)]
    return rows.with_columns(pl.Series("decode_tok_s", rates, dtype=pl.Float64))


def references(run: Run, slot: int = 0) -> dict[str, parity.Stream]:
    all_streams = streams(run)
    refs = run.dump.requests.filter((pl.col("role") == "reference") & (pl.col("slot") == slot))
    return {row["prompt_id"]: stream_of(all_streams, row) for row in refs.iter_rows(named=True)}


def comparisons(run: Run, epsilon: float = parity.NEAR_TIE_EPSILON) -> list[tuple[dict, parity.Comparison]]:
    """Every batched request (in the tables' order) and its comparison with ref #1."""
    all_streams, refs = streams(run), references(run)
    bands = requests(run).filter(pl.col("role") == "band").sort(BAND_ORDER)
    return [(row, parity.compare(refs[row["prompt_id"]], stream_of(all_streams, row), epsilon=epsilon)) for row in bands.iter_rows(named=True)]


def band_rows(run: Run, epsilon: float = parity.NEAR_TIE_EPSILON) -> list[dict]:
    all_streams, refs = streams(run), references(run)
    bands = requests(run).filter(pl.col("role") == "band").sort(BAND_ORDER)
    rows = []
    for (prompt, c, repeat), group in bands.group_by(["prompt_id", "c", "repeat"], maintain_order=True):
        slots = [stream_of(all_streams, r) for r in group.iter_rows(named=True)]
        summary = parity.band_summary(refs[prompt], slots, epsilon=epsilon)
        summary.pop("comparisons")
        widths, _ = band_widths(run.manifest, prompt, c, repeat)
        spans = _send_spans(group)
        rows.append({"prompt_id": prompt, "c": c, "repeat": repeat, "m_formed": max(widths) if widths else None, **summary,
                     "decode_tok_s": parity.band_decode_rate(group["decode_tok_s"].to_list()), "s_per_1000_seq": _seconds_per_1000(spans),
                     "release_skew_s": _release_skew(spans), "prefix_cache": _cache_summary(run.manifest, prompt, c, repeat)})
    return rows


def prompt_rows(run: Run) -> list[dict]:
    refs, all_streams = references(run), streams(run)
    rows = []
    for prompt, ref in refs.items():
        bands = run.dump.requests.filter((pl.col("prompt_id") == prompt) & (pl.col("role") == "band"))
        firsts = [stream_of(all_streams, r) for r in bands.filter(pl.col("slot") == 0).sort("c", "repeat").iter_rows(named=True)]
        configurations = [ref, *firsts]
        density = parity.tie_density(parity.step_margins(ref))
        rows.append({"prompt_id": prompt, "tie_density_1e-3": density[1e-3], "tie_density_1e-2": density[1e-2], "tie_density_1e-1": density[1e-1],
                     "div_index": parity.div_index(configurations), "avg_std_top1_prob": parity.avg_std_top1_prob(configurations),
                     "std_output_length": float(np.std([len(s) for s in configurations]))})
    return rows


def flip_curve(run: Run) -> pl.DataFrame:
    refs, all_streams = references(run), streams(run)
    bands = run.dump.requests.filter(pl.col("role") == "band").sort(BAND_ORDER)
    return parity.flip_curve([(refs[row["prompt_id"]], stream_of(all_streams, row)) for row in bands.iter_rows(named=True)])
