"""The certificate (analysis.certificate) on runs assembled from hand-written streams and on the bundled real runs, and
on the report's verdict cards. Kept apart from tests/test_certificate.py, whose hand-made tables are fast enough for
mutation testing: these read whole runs."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import ROOT
from test_certificate import A, _run

from analysis import band_table, certificate, read_run

def test_a_run_bit_identical_to_m1_is_amber_and_unverified_without_its_batch(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    amber = certificate(_run(tmp_path / "a", [A, A])).row(0, named=True)
    # 0 of 2: 1 - 0.05^(1/2) = 1 - 0.2236 = 0.7764
    assert amber["verdict"] == "AMBER" and amber["upper_bound"] == pytest.approx(0.7764, abs=1e-4)
    assert certificate(_run(tmp_path / "b", [A, A], widths=(1, 1))).row(0, named=True)["verdict"] == "UNVERIFIED"


def test_a_needle_run_is_its_own_arm_and_each_arm_is_judged_alone(tmp_path, monkeypatch):
    import analysis.studies._certificate as module

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    assert certificate(_run(tmp_path / "a", [A, A], layout="needle"))["arm"].to_list() == ["mixed"]
    # a run probed with arms: the slot table names each request's arm (here slot 1 in "mixed", as if fired in that arm)
    split = lambda frame: frame.with_columns(arm=pl.when(pl.col("slot") == 1).then(pl.lit("mixed")).otherwise(pl.lit("copies")))  # noqa: E731
    slots = module.slot_table
    monkeypatch.setattr(module, "slot_table", lambda run, *a, **k: split(slots(run, *a, **k)))
    run = _run(tmp_path / "b", [A, [("a", -0.5), ("x", -0.25), ("c", -0.125)]])
    table = certificate(run)
    assert table.select("arm", "verdict", "requests", "tokens_parted").rows() == [("copies", "AMBER", 1, 0), ("mixed", "RED", 1, 1)]


def test_the_bundled_runs():
    # llama.cpp on CPU with its prompt cache: even c=1 differs from m=1 in bits (26 ULP at token 0), never in tokens
    cached = certificate(ROOT / "data" / "llamacpp-cpu" / "cache-prompt").row(0, named=True)
    assert cached["run"] == str(ROOT / "data" / "llamacpp-cpu" / "cache-prompt")
    assert (cached["verdict"], cached["requests"], cached["tokens_parted"], cached["bits_only"]) == ("RED", 58, 0, 58)
    assert cached["first"] == {"prompt_id": "p0", "band_c": 1, "repeat": 0, "slot": 0, "parted": "bits", "at": 0, "max_ulp": 26}
    # without it, c=1 is bit-identical, and the batched path differs from c=4 on
    uncached = certificate(read_run(ROOT / "data" / "llamacpp-cpu" / "no-cache-prompt")).row(0, named=True)
    assert uncached["verdict"] == "RED" and uncached["first"]["band_c"] == 4 and uncached["bits_only"] == 56
    # vLLM's CPU build: bit-identical at every c, but the gauge and the streams never saw some batches whole
    # (the bands below c, read from band_table's widths: the certificate names each, with the widest batch seen)
    vllm_run = read_run(ROOT / "data" / "vllm-cpu" / "prefix-cache")
    vllm = certificate(vllm_run).row(0, named=True)
    short = band_table(vllm_run).filter((pl.col("band_c") > 1) & (pl.col("m_formed") < pl.col("band_c"))).sort("band_c", "prompt_id")
    assert short.height >= 1 and (vllm["verdict"], vllm["divergent"], vllm["bands_unformed"]) == ("UNVERIFIED", 0, short.height)
    assert vllm["unformed"] == [{"prompt_id": p, "band_c": c, "repeat": r, "widest_seen": m}
                                for p, c, r, m in short.select("prompt_id", "band_c", "repeat", "m_formed").rows()]
    # the torch experiment's batch-invariant mode: every batch formed and bit-identical, 58 requests: too few for 1%
    invariant = certificate(ROOT / "data" / "experiment-cpu" / "batch-invariant", target_rate=0.06).row(0, named=True)
    assert invariant["verdict"] == "GREEN"  # 0 of 58 bounds the rate at 5.03%, below 6%


def test_the_report_s_verdict_cards_open_with_the_certificate(tmp_path):
    from analysis import read_witnesses
    from analysis.report import reviews_html

    # a prompt id is untrusted text: the card escapes it
    run = _run(tmp_path, [A, [("a", -0.5), ("b", -0.2500001), ("c", -0.125)]], prompt="<b>p</b>")
    page = reviews_html(read_witnesses([], progress=False), [run, read_run(ROOT / "data" / "vllm-cpu" / "prefix-cache")], epsilon=0.05)
    assert ('<dt>certificate (copies)</dt><dd class="bia-fail">RED at a 1% target: 1 of 2 requests part from m=1 (0 in tokens, 1 only in '
            'bits); the first is &lt;b&gt;p&lt;/b&gt; c=2 slot 1: only its logprob bits differ, from token 1 (up to 3 ULP).</dd>') in page
    assert "<b>p</b>" not in page
    # the certificate comes first on the card, before the bits line
    vllm = page.split("vllm-cpu/prefix-cache")[1]
    assert vllm.index('<dt>certificate (copies)</dt><dd class="bia-warn">UNVERIFIED at a 1% target: no request parts from m=1') < vllm.index("<dt>bits</dt>")
