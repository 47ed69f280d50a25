"""Control arms in one run (bia probe --arms) and the attribution of each divergence to its cause.

The attribution ladder is checked on frames made by hand (each expected cause worked out in the
comments), the arms against a real ``bia serve`` on loopback; tests/test_llamacpp_arms.py runs them
against the real llama.cpp server with its prompt cache on and off.
"""

from __future__ import annotations

import asyncio
import json
import re

import polars as pl
import pytest
from _cli import bia

from analysis import attribution_shares, attribution_table, read_run
from analysis.probe import PROFILES, ProbeError, probe
from analysis.probe._arms import check_arms, completion_prefix, prefill_body, prefix_primer
from analysis.run import band_table, plan, slot_table, width_table
from analysis.run._arms import ARM_REPEATS, PREFIX_SHARES, with_arm_column
from analysis.studies import prefill_table
from analysis.studies._attribution import _attribute

ALL_ARMS = ["repeat", "copies", "mixed", "prefix", "cache", "serial", "prefill"]


# --- the plan and the arm column -------------------------------------------------------------------


def test_a_run_without_arms_plans_and_names_its_units_as_before():
    manifest = {"ladder": [1, 4], "prompts": [{"prompt_id": "p0"}]}
    assert [u.key for u in plan(manifest)] == ["p0/reference/s0", "p0/reference/s1", "p0/band/c1/r0", "p0/band/c4/r0"]
    assert all(u.arm is None for u in plan(manifest))


def test_the_arms_plan_fires_each_arm_per_prompt_and_repeat():
    manifest = {"ladder": [1, 4], "arms": ALL_ARMS, "repeats": 2, "prompts": [{"prompt_id": "p0"}, {"prompt_id": "p1"}],
                "sampler": {"max_tokens": 5}}
    units = plan(manifest)
    per_prompt = [u for u in units if u.prompt_id == "p0"]
    by_arm = {arm: [u for u in per_prompt if u.arm == arm] for arm in ALL_ARMS}
    # per repeat: 3 repeats alone, 2 copies bands, 2 mixed bands, 3 prefix shares, 1 cache, 1 serial band; prefill once
    assert [len(by_arm[a]) for a in ALL_ARMS] == [2 * ARM_REPEATS, 2 * 2, 2 * 2, 2 * len(PREFIX_SHARES), 2, 2, 1]
    assert [u.repeat for u in by_arm["repeat"]] == list(range(2 * ARM_REPEATS))  # each repeat of the arm its own unit
    assert by_arm["serial"][0].c == 4 and by_arm["serial"][0].slots == (0, 1, 2, 3)  # the widest c, every request recorded
    assert by_arm["mixed"][1].slots == (0,)  # the needle alone is the unit's own; the others are fillers
    assert by_arm["prefill"][0].slots == (1, 2, 3, 4) and by_arm["prefill"][0].key == "p0/prefill/r0"
    assert len({u.key for u in units}) == len(units)  # no two units share a name
    assert by_arm["copies"][0].key == "p0/band/c1/r0"  # the copies arm keeps the names of a run without arms


def test_requests_read_as_their_envelope_arm_and_runs_without_arms_as_copies_or_mixed():
    requests = pl.DataFrame({"role": ["reference", "band", "band", "filler"], "extra": [None, '{"arm": "serial"}', None, None]})
    assert with_arm_column(requests, {"arms": ["serial"]})["arm"].to_list() == ["reference", "serial", "copies", "copies"]
    assert with_arm_column(requests, {"requested": {"layout": "needle"}})["arm"].to_list() == ["reference", "serial", "mixed", "mixed"]
    pandas = with_arm_column(requests.to_pandas(), {})
    assert list(pandas["arm"]) == ["reference", "serial", "copies", "copies"]


def test_the_bundled_run_made_before_arms_keeps_every_table():
    run = read_run("data/experiment-cpu/default")
    assert set(run.requests["arm"]) == {"reference", "copies"}
    assert set(slot_table(run)["arm"]) == {"copies"} and set(band_table(run)["arm"]) == {"copies"}
    assert run.missing() == []


# --- refusals before anything is fired -------------------------------------------------------------


@pytest.mark.parametrize(("arms", "profile", "words"), [
    (["copies", "copies"], None, "names an arm twice"),
    (["needle"], None, "unknown arm 'needle'"),
    ("copies", None, "must be a list"),
    (["cache"], "openai", "the cache arm cannot run on a plain OpenAI-compatible server"),
    (["cache"], "sglang", "the cache arm cannot run on SGLang"),
    (["prefill"], "sglang", "logprob_start_len"),
    (["prefill"], "apr", "the prefill arm cannot run on apr serve"),
])
def test_arms_no_run_can_be_made_of_are_refused_with_the_reason(arms, profile, words):
    with pytest.raises(ProbeError, match=words):
        check_arms(arms, PROFILES[profile] if profile else None)


def test_arms_and_the_needle_layout_are_not_given_together():
    with pytest.raises(ProbeError, match="the needle layout is the mixed arm; give arms or a layout, not both"):
        check_arms(["copies"], layout="needle")


def test_every_arm_runs_on_llama_cpp_vllm_and_bia_serve():
    for name in ("llamacpp", "vllm", "bia"):
        check_arms(ALL_ARMS, PROFILES[name])


@pytest.mark.engine
def test_the_probe_refuses_an_arm_the_engine_cannot_run_before_firing_anything(tmp_path):
    pytest.importorskip("torch")
    from analysis.serve import BackgroundServer

    with BackgroundServer("default") as server:
        with pytest.raises(ProbeError, match="the cache arm cannot run on a plain OpenAI-compatible server"):
            asyncio.run(probe(server.url, tmp_path / "run", prompts=["Hi"], ladder=(1,), max_tokens=2, engine="openai", arms=["cache"]))
    assert not (tmp_path / "run").exists()  # nothing was fired, nothing written


def test_prefill_requests_word_the_reference_prefix_as_each_engine_takes_it():
    base = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "seed": 0}
    llama = prefill_body(base, "Hi", " yo", PROFILES["llamacpp"])
    assert llama["messages"][-1] == {"role": "assistant", "content": " yo"} and llama["cache_prompt"] is False and llama["max_tokens"] == 1
    vllm = prefill_body(base, "Hi", " yo", PROFILES["vllm"])
    assert vllm["continue_final_message"] is True and vllm["add_generation_prompt"] is False and len(vllm["cache_salt"]) == 32
    assert prefill_body(base, "Hi", " yo", PROFILES["bia"])["messages"] == [{"role": "user", "content": "Hi yo"}]
    assert completion_prefix([b"a", None], 2) == (None, "a token among the first 2 has neither bytes nor text")
    # 40 characters: the shares 0.25, 0.5, 0.9 keep 10, 20 and 36 of them
    text = "abcdefghij" * 4
    assert [len(prefix_primer(text, i).split(" Now")[0]) for i in range(3)] == [10, 20, 36]


# --- attribution, on cases worked out by hand ------------------------------------------------------


def _slots(rows):
    columns = ["prompt_id", "arm", "c", "repeat", "slot", "bitwise_prefix", "divergence_at"]
    frame = pl.DataFrame(rows, schema=dict(zip(columns, [pl.String, pl.String, pl.Int64, pl.Int64, pl.Int64, pl.Int64, pl.Int64])), orient="row")
    return frame.with_columns(length=pl.lit(8, pl.Int64), max_ulp=pl.lit(1, pl.Int64)).with_columns(parted=pl.col("bitwise_prefix") < pl.col("length"))


def test_attribution_names_the_first_control_that_parts_no_later_than_the_request():
    slots = _slots([
        ("p0", "repeat", 1, 0, 0, 8, None),  # alone and cold: bit-identical to m=1, so run-to-run noise explains nothing
        ("p0", "cache", 1, 0, 0, 2, None),  # the warm cache parts at step 2
        ("p0", "copies", 1, 0, 0, 2, None),  # parts at 2: cache (2 <= 2) comes before any later rung -> cache state
        ("p0", "copies", 4, 0, 0, 1, 5),  # parts at 1, tokens at 5: cache (2) and prefill (3) part later; itself at c=4 -> co-batching
        ("p0", "copies", 4, 0, 1, 4, None),  # parts at 4: cache (2 <= 4) -> cache state
        ("p0", "mixed", 4, 0, 0, 0, None),  # parts at 0: only itself parts that early -> mixing
        ("p0", "mixed", 2, 0, 0, 1, None),  # parts at 1: copies part at 1 but at c=4, not c=2; itself -> mixing
        ("p0", "mixed", 8, 0, 0, 3, None),  # parts at 3: cache (2) -> cache state
        ("p1", "copies", 1, 0, 0, 8, None),  # p1 at c=1 is bit-identical: not listed
        ("p1", "serial", 4, 0, 2, 5, None),  # serial is no rung, and p0's controls do not count for p1 -> unexplained
    ])
    prefill = pl.DataFrame({"prompt_id": ["p0", "p0", "p0"], "position": [1, 2, 3], "same_token": [True, True, True],
                            "same_bits": [True, True, False]})  # the prefill path parts at position 3
    table = _attribute(slots, prefill)
    got = table.select("prompt_id", "arm", "c", "slot", "kind", "cause", "evidence_arm", "evidence_c", "evidence_slot",
                       "evidence_part").rows()
    assert got == [
        ("p0", "cache", 1, 0, "bits", "cache state", "cache", 1, 0, 2),
        ("p0", "copies", 1, 0, "bits", "cache state", "cache", 1, 0, 2),
        ("p0", "copies", 4, 0, "tokens", "co-batching", "copies", 4, 0, 1),
        ("p0", "copies", 4, 1, "bits", "cache state", "cache", 1, 0, 2),
        ("p0", "mixed", 4, 0, "bits", "mixing", "mixed", 4, 0, 0),
        ("p0", "mixed", 2, 0, "bits", "mixing", "mixed", 2, 0, 1),
        ("p0", "mixed", 8, 0, "bits", "cache state", "cache", 1, 0, 2),
        ("p1", "serial", 4, 2, "bits", "unexplained", None, None, None, None),
    ]
    # per c, the share of the requests that part: c=1 two of two on the cache; c=4 one cache, one co-batching, one mixing
    shares = attribution_shares(table).filter(pl.col("c").is_in([1, 4])).rows()
    assert shares == [(1, "cache state", 2, 1.0), (4, "cache state", 1, 1 / 4), (4, "co-batching", 1, 1 / 4), (4, "mixing", 1, 1 / 4),
                      (4, "unexplained", 1, 1 / 4)]


def test_attribution_takes_the_prefill_path_before_a_shared_prefix_and_a_token_fork_as_the_evidence_kind():
    slots = _slots([
        ("p0", "prefix", 1, 0, 0, 3, None),  # the prefix control parts at 3
        ("p0", "copies", 4, 0, 0, 3, 3),  # parts at 3 (tokens): prefill (1) and prefix (3) both reproduce; prefill's rung is first
    ])
    prefill = pl.DataFrame({"prompt_id": ["p0", "p0"], "position": [1, 2], "same_token": [False, True], "same_bits": [False, True]})
    table = _attribute(slots, prefill)
    assert table.select("arm", "cause", "evidence_arm", "evidence_part", "evidence_kind").rows() == [
        ("prefix", "prefill path", "prefill", 1, "tokens"), ("copies", "prefill path", "prefill", 1, "tokens")]


def test_nothing_parts_nothing_is_listed():
    assert _attribute(_slots([("p0", "copies", 4, 0, 0, 8, None)]), pl.DataFrame(
        schema={"prompt_id": pl.String, "position": pl.Int64, "same_token": pl.Boolean, "same_bits": pl.Boolean})).height == 0


# --- every arm against a real bia serve ------------------------------------------------------------


@pytest.fixture(scope="module")
def served_arms(tmp_path_factory):
    pytest.importorskip("torch")
    from analysis.serve import BackgroundServer

    folder = tmp_path_factory.mktemp("arms") / "run"
    log = folder.parent / "serve.log"
    with BackgroundServer("default", log_file=log) as server:
        asyncio.run(probe(server.url, folder, prompts=["If the argument is", "The cat sat on"], ladder=(1, 4), max_tokens=8,
                          arms=ALL_ARMS, server_log=log))
    return read_run(folder, cache=False)


@pytest.mark.engine
def test_every_arm_against_bia_serve_is_recorded_once_and_complete(served_arms):
    run = served_arms
    assert run.manifest["arms"] == ALL_ARMS and run.manifest["complete"] and run.manifest["refused"] == [] and run.missing() == []
    counts = dict(run.requests.filter(pl.col("role") != "filler").group_by("arm").len().rows())
    # per prompt: 2 references, 3 repeats, 1 + 4 copies, 2 mixed targets, 3 prefix targets, 1 cache, 4 serial, 7 prefill positions
    assert counts == {"reference": 4, "repeat": 6, "copies": 10, "mixed": 4, "prefix": 6, "cache": 2, "serial": 8, "prefill": 14}
    fillers = run.requests.filter(pl.col("role") == "filler")  # mixed c=4: 3 others; prefix: 3 primers; cache: 1 primer
    assert dict(fillers.group_by("arm").len().rows()) == {"mixed": 6, "prefix": 6, "cache": 2}
    bands = band_table(run)
    serial = bands.filter(arm="serial")
    assert serial["n_slots"].to_list() == [4, 4] and serial["m_formed"].to_list() == [1, 1]  # one after another: never two at once
    assert bands.filter(arm="copies", c=4)["m_formed"].to_list() == [4, 4]  # bia serve's log: the copies did share a batch
    assert set(width_table(run)["arm"]) == set(ALL_ARMS) - {"prefill"}


@pytest.mark.engine
def test_bia_serve_alone_and_cold_repeats_m1_bit_for_bit_and_its_drift_is_put_on_a_cause(served_arms):
    run = served_arms
    slots = slot_table(run)
    alone = slots.filter(pl.col("arm").is_in(["repeat", "cache", "prefix", "serial"]) | (pl.col("c") == 1))
    assert (alone["bitwise_prefix"] == alone["length"]).all()  # bia serve has no prompt cache: a request alone is m=1, bit for bit
    prefill = prefill_table(run)
    assert prefill.height == 2 * 7 and prefill["same_token"].all()
    table = attribution_table(run)
    parted = slots.filter(pl.col("bitwise_prefix") < pl.col("length"))
    assert table.height == parted.height > 0 and set(table["c"]) == {4}  # only c=4 drifts on bia serve's default kernels
    assert not set(table["cause"]) & {"run-to-run", "cache state", "shared prefix"}  # their controls never part
    for row in table.iter_rows(named=True):  # each cause's evidence parts no later than the request it explains
        assert row["cause"] in ("prefill path", "co-batching", "mixing") and row["evidence_part"] <= row["bitwise_prefix"]
    first_bits = prefill.filter(~pl.col("same_bits"))["position"].to_list()
    expected = "prefill path" if first_bits and min(first_bits) <= table["bitwise_prefix"].min() else "co-batching"
    assert table.sort("bitwise_prefix")["cause"][0] == expected
    card = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", run._repr_html_()))  # the run's card counts arm by arm
    assert "serial c=4: 8 of 8 requests bit-identical to ref #1, 8 token-identical" in card and "repeat c=1: 6 of 6" in card
    envelope = json.loads(run.requests.filter(arm="cache", role="band")["extra"][0])
    assert envelope["arm"] == "cache" and envelope["unit"] == "p0/cache/band/c1/r0"


# --- the report's section --------------------------------------------------------------------------


def test_the_attribution_figure_splits_each_bar_by_the_causes_shares():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analysis.views.plots import plot_attribution

    shares = pl.DataFrame({"engine": ["e", "e", "e"], "c": [1, 4, 4], "cause": ["cache state", "cache state", "co-batching"],
                           "requests": [2, 1, 3], "share": [1.0, 0.25, 0.75]})
    ax = plot_attribution(shares)
    drawn = sorted((container.get_label(), float(bar.get_x()), float(bar.get_width())) for container in ax.containers for bar in container
                   if bar.get_width() > 0)
    # c=1 is one bar of the cache; c=4 is a quarter of the cache, then three quarters of co-batching after it
    assert drawn == [("cache state", 0.0, 0.25), ("cache state", 0.0, 1.0), ("co-batching", 0.25, 0.75)]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["cache state", "co-batching"]
    plt.close(ax.figure)


@pytest.mark.engine
def test_the_report_section_names_the_causes_and_escapes_the_run_names(served_arms):
    import dataclasses
    import re
    from pathlib import Path

    from analysis.views.html import reviews_html
    from analysis.views.html import attribution_html
    from analysis.witness import read_witnesses

    hostile = dataclasses.replace(served_arms, path=Path("runs") / "<i>bad&run")  # the engine label names the run's folder
    page = attribution_html([hostile])
    assert "<i>" not in page and page.count("bia serve (&lt;i&gt;bad&amp;run)") >= 2  # in the figure's alt text and the tables
    assert page.count('src="data:image/png;base64,') == 1 and "Why streams part" in page
    text = re.sub(r"<[^>]+>", " ", page)
    assert "co-batching" in text or "prefill path" in text
    assert attribution_html([read_run("data/experiment-cpu/default")]) == ""  # no arms, no section
    # the verdict cards carry the section after them, for the runs with arms only
    cards = reviews_html(read_witnesses([]), [served_arms], epsilon=0.05)
    assert cards.index("Why streams part") > 0


def test_a_sequential_request_whose_connection_was_closed_unanswered_is_sent_once_more(tmp_path):
    import threading

    from loopback import HttpServer, Quiet, stream_words

    posts = []
    lock = threading.Lock()

    class ClosesTheThird(Quiet):
        def do_GET(self):
            self.answer(404, b"{}")

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            with lock:
                posts.append(self.path)
                n = len(posts)
            if n == 3:  # the first of the serial arm's requests: the connection closes before any answer, as llama-server's can
                self.close_connection = True
                return
            stream_words(self, ["a", "b", "c"])

    with HttpServer(ClosesTheThird) as server:
        folder = asyncio.run(probe(server.url, tmp_path / "run", prompts=["Hi"], ladder=(1, 2), max_tokens=3, engine="openai", arms=["serial"]))
    run = read_run(folder)
    # two references, then the serial band of 2: 4 requests kept from 5 POSTs, the third sent again
    assert len(posts) == 5 and run.manifest["refused"] == [] and run.missing() == []
    assert [entry["partial"] for entry in run.manifest["resent"]] == ["p0.serial.band.c2.r0.s0.sse"]
    assert "without sending a response" in run.manifest["resent"][0]["reason"]
    assert slot_table(run).filter(arm="serial")["slot"].to_list() == [0, 1]


def test_a_manifest_naming_an_unknown_arm_is_refused_naming_the_field(tmp_path):
    from analysis.run import RunError, load_manifest

    (tmp_path / "manifest.json").write_text(json.dumps({"arms": ["copies", "needle"]}))
    with pytest.raises(RunError, match='manifest.json: field "arms": expected a list of distinct arm names'):
        load_manifest(tmp_path)


@pytest.mark.slow
def test_bia_probe_refuses_an_unknown_arm_before_connecting():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = bia("probe", "http://127.0.0.1:9", "-o", "unused", "--arms", "copies,needle", timeout=120, cwd=root)
    assert done.returncode == 2 and "unknown arm 'needle': arms are repeat, copies, mixed, prefix, cache, serial, prefill" in done.stderr
    assert not (root / "unused").exists()


@pytest.mark.engine
def test_a_dry_run_lists_the_arms_units_and_counts_their_primers():
    pytest.importorskip("torch")
    from analysis.probe import dry_run
    from analysis.serve import BackgroundServer

    with BackgroundServer() as server:
        planned = asyncio.run(dry_run(server.url, prompts=["Hi"], ladder=(1, 4), max_tokens=4, arms=["repeat", "serial", "prefill", "cache"]))
    assert planned["units"] == ["p0/reference/s0", "p0/reference/s1", "p0/repeat/band/c1/r0", "p0/repeat/band/c1/r1", "p0/repeat/band/c1/r2",
                                "p0/serial/band/c4/r0", "p0/prefill/r0", "p0/cache/band/c1/r0"]
    assert planned["requests"] == 2 + 3 + 4 + 3 + (1 + 1)  # references, repeats, serial, prefill positions 1-3, the cache's primer and request


@pytest.mark.engine
def test_a_run_with_arms_written_again_reads_back_with_its_arms(served_arms, tmp_path):
    from analysis import write_run

    again = read_run(write_run(served_arms, tmp_path / "again"))
    count = lambda run: run.requests.group_by("arm", "role").len().sort("arm", "role").rows()  # noqa: E731
    assert count(again) == count(served_arms) and again.manifest["arms"] == ALL_ARMS
    assert prefill_table(again).equals(prefill_table(served_arms))
