"""The report's 'Sampler and trainer' section (analysis/studies/_rl_mismatch.py, drawn by analysis/views/html/mismatch.py and analysis/views/plots/mismatch.py): its tables on a case worked by hand,
escaped names, the margins taken from the run beside the pairs, and the figures' artists."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import polars as pl
import pytest
from conftest import ROOT

import analysis
from analysis.plots import rl_mismatch_figures
from analysis.studies import stale_pairs
from analysis.views.html import rl_mismatch_html

pytestmark = pytest.mark.slow

TRAINER = ROOT / "data" / "experiment-cpu" / "trainer"


@pytest.fixture
def hand(tmp_path):
    """Two sequences: the spec's worked example (r = [-0.1, -2.0], t = [-0.12, -1.9]) under a hostile id, and one whose
    trainer agrees to the bit."""
    lines = [
        {"schema_version": 1, "sample_id": "<b>s0</b>", "token_ids": [5, 6], "inference_logprobs": [-0.1, -2.0],
         "trainer_logprobs": [-0.12, -1.9], "loss_mask": [1, 1], "prompt_id": "<i>p</i>", "c": 4},
        {"schema_version": 1, "sample_id": "s1", "token_ids": [7], "inference_logprobs": [-0.5], "trainer_logprobs": [-0.5],
         "loss_mask": [1], "prompt_id": "p1", "c": None},
    ]
    path = tmp_path / "trainer" / "<evil>.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_tokens_and_largest_k3_by_hand(hand):
    tokens = analysis.mismatch_tokens([hand])
    assert tokens["run"].unique().to_list() == [f"{hand.parent.parent.name}/<evil>"]
    assert tokens["delta"].to_list() == pytest.approx([-0.02, 0.1, 0.0])
    assert tokens["margin"].null_count() == 3  # no run directory beside the pairs: no sampler margin
    top = analysis.largest_k3([hand]).to_dicts()
    # K3 = exp(d) - 1 - d per token: exp(-0.02) + 0.02 - 1 = 0.000198673, exp(0.1) - 1.1 = 0.00517092; mean 0.0026848 (the spec's)
    assert top[0]["request"] == "<b>s0</b>" and top[0]["K3 (token mean)"] == pytest.approx(0.0026848, rel=1e-4)
    assert (top[0]["tokens parted"], top[0]["first parted at"], top[0]["max |delta|"]) == (2, 0, pytest.approx(0.1))
    assert top[0]["c"] == 4 and top[1]["c"] is None
    assert (top[1]["request"], top[1]["K3 (token mean)"], top[1]["tokens parted"], top[1]["first parted at"]) == ("s1", 0.0, 0, None)


def test_summaries_by_hand(hand):
    table = analysis.mismatch_summaries([hand])
    value = dict(zip(table["logged name"], table[table.columns[-1]]))
    # SkyRL: |r - t| over every masked token: (0.02 + 0.1 + 0) / 3; OpenRLHF's vllm_kl: mean of r - t = (0.02 - 0.1 + 0) / 3
    assert value["policy/rollout_train_logprobs_abs_diff_mean"] == pytest.approx(0.04)
    assert value["vllm_kl"] == pytest.approx(-0.08 / 3)
    assert table.filter(pl.col("logged name") == "vllm_kl")["framework"].item() == "openrlhf"


def test_the_html_is_escaped_and_says_what_parted(hand):
    html = rl_mismatch_html([hand])
    assert "<b>s0</b>" not in html and "&lt;b&gt;s0&lt;/b&gt;" in html
    assert "<evil>" not in html and "&lt;evil&gt;: 2 of 3 tokens part, by up to 0.1 nats" in html
    assert "<i>p</i>" not in html


def test_the_bundled_runs_margins_come_from_the_run_beside_the_pairs():
    tokens = analysis.mismatch_tokens([TRAINER / "default.jsonl"])
    assert tokens.height == 3968 and tokens["margin"].null_count() == 0
    from analysis.run import read_run

    run = read_run(ROOT / "data" / "experiment-cpu" / "default")
    first = run.candidates.filter((pl.col("record") == 1) & (pl.col("position") == 0))["cand_logprob"].sort(descending=True)
    assert tokens.filter((pl.col("request") == "p0-ref1") & (pl.col("position") == 0))["margin"].item() == first[0] - first[1]


def test_the_figures(hand):
    (dist, alt), (by_margin, _) = rl_mismatch_figures([TRAINER / "default.jsonl", TRAINER / "fixed-tiles.jsonl"])
    hist, along = dist.axes
    labels = [t.get_text() for t in hist.get_legend().get_texts()]
    lines = [json.loads(line) for line in (TRAINER / "default.jsonl").read_text().splitlines()]
    same = sum(r == t for line in lines for r, t in zip(line["inference_logprobs"], line["trainer_logprobs"]))  # counted from the file
    assert 0 < same < 3968
    assert labels == [f"experiment-cpu/default ({same} of 3968 at exactly 0)", "experiment-cpu/fixed-tiles (3968 of 3968 at exactly 0)"]
    assert hist.get_xscale() == "log" and along.get_yscale() == "log" and "log scale" in alt
    points = by_margin.axes[0].collections
    assert [len(c.get_offsets()) for c in points] == [3968 - same, 0]  # every parted default token has a margin; fixed-tiles none
    plt.close("all")
    (dist, _), (by_margin, _) = rl_mismatch_figures([TRAINER / "fixed-tiles.jsonl"])
    assert all(getattr(ax, "bia_empty", None) for ax in [*dist.axes, *by_margin.axes])  # nothing parted: each panel says why
    plt.close("all")


def test_pairs_are_found_beside_their_runs(tmp_path):
    assert analysis.trainer_pairs([tmp_path / "default"]) == []
    assert [p.name for p in analysis.trainer_pairs([ROOT / "data" / "experiment-cpu" / m for m in ("fixed-tiles", "default")])] == [
        "fixed-tiles.jsonl", "default.jsonl"]


def test_pairs_that_are_not_of_the_run_beside_them_are_said(tmp_path):
    """A run decoded again after its pairs were written: the section says which token no longer matches, and how to rewrite."""
    import shutil

    shutil.copytree(ROOT / "data" / "experiment-cpu" / "default", tmp_path / "default")
    (tmp_path / "trainer").mkdir()
    lines = (TRAINER / "default.jsonl").read_text().splitlines()
    second = json.loads(lines[1])
    second["inference_logprobs"][5] = -1.5  # as if p0-ref2 had been decoded again to other bits at its token 5
    lines[1] = json.dumps(second)
    pairs = tmp_path / "trainer" / "default.jsonl"
    pairs.write_text("\n".join(lines) + "\n")
    assert stale_pairs([TRAINER / "default.jsonl"]) == []
    said = stale_pairs([pairs])
    assert len(said) == 1 and said[0].startswith(f"{pairs}: sample_id 'p0-ref2', inference_logprobs[5] is -1.5 where the run ")
    assert "(1 token differs)" in said[0] and f"--trainer --recompute {tmp_path / 'default'} --force" in said[0]
    assert '<p class="bia-fail">' in rl_mismatch_html([pairs])
