"""Issue 40: the same server, the same verdict. bia serve's batching window and --max-batch, the probe firing again a band
seen narrower than its c, each batched request's row and batch in its envelope, and bia certify URL's plan in distinct
batch contexts; the engine-marked test certifies bia serve under a busy CPU."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from _cli import bia

from analysis.probe import ProbeError, ProbeSettings, planned_repeats, probe
from analysis.probe._bands import band_rows, distinct_contexts, fire_again
from analysis.run import ROTATING, batch_id, plan, read_run, rotating_batch
from analysis.studies._next_steps import next_step


# ---- the rotating layout and the plan's contexts (no server) ----

def _manifest(prompts, repeats, layout=ROTATING, ladder=(1, 4, 8, 16), fillers=()):
    return {"prompts": [{"prompt_id": f"p{i}", "text": t} for i, t in enumerate(prompts)], "ladder": list(ladder),
            "repeats": repeats, "fillers": list(fillers), "sampler": {"seed": 0}, "requested": {"layout": layout}}


def test_no_two_repeats_of_a_rotating_band_put_the_same_companion_at_the_same_row():
    for c in (2, 4, 16):
        seen = {(tuple(batch), tuple(rows)) for batch, rows in (rotating_batch("a", ["x", "y"], c, r) for r in range(5 * c))}
        assert len(seen) == 5 * c  # every repeat a new batch
    batch, rows = rotating_batch("a", ["x"], 4, 6)  # row 6 % 4 = 2, the second companion: past the pool, made up
    assert batch == ["a", "a", "Count from 1 to 10.", "a"] and rows == [0, 1, 3]


@pytest.mark.parametrize("prompts, ladder", [(["If the argument is", "This function returns"], (1, 4, 8, 16)),
                                             (["If the argument is"], (1, 2, 4))])
def test_the_certificate_plan_reaches_the_bound_in_distinct_contexts(prompts, ladder):
    repeats = planned_repeats(target_rate=0.01, confidence=0.95, ladder=ladder, prompts=len(prompts))
    manifest = _manifest(prompts, repeats, ladder=ladder)
    units = plan(manifest)
    recorded = sum(len(u.slots) for u in units if u.role == "band" and u.c > 1)
    assert distinct_contexts(manifest, units) == recorded >= 299  # every batched request in a context of its own
    assert distinct_contexts(manifest, plan(_manifest(prompts, repeats - 1, ladder=ladder))) < 299  # the fewest repeats
    copies = _manifest(prompts, repeats, layout="copies", ladder=ladder)  # copies repeat their contexts: never 299
    assert distinct_contexts(copies, plan(copies)) == len(prompts) * sum(c for c in ladder if c > 1)


def test_band_rows_name_the_batch_by_prompt_id_and_fillers_by_their_hash():
    manifest = _manifest(["If the argument is", "This function returns"], 2, fillers=())
    unit = next(u for u in plan(manifest) if u.key == "p0/band/c4/r1")
    bodies, roles, rows, batch = band_rows(unit, manifest, {"messages": [{"role": "user", "content": "If the argument is"}]})
    assert batch == ["p0", "p1", "p0", "p0"] and rows == [0, 2, 3]  # repeat 1: the companion (the set's other prompt) at row 1
    assert roles == [("band", 0), ("filler", 1), ("band", 1), ("band", 2)]
    assert bodies[1]["messages"][0]["content"] == "This function returns"
    assert batch_id("Count from 1 to 10.", {}).startswith("filler:") and len(batch_id("x", {})) == len("filler:") + 12


def test_a_band_is_fired_again_only_when_its_evidence_shows_it_narrower_and_within_its_bounds():
    assert fire_again(16, 14, 1, 2, 1.0, 60.0)
    assert not fire_again(16, 16, 1, 2, 1.0, 60.0)  # formed
    assert not fire_again(16, None, 1, 2, 1.0, 60.0)  # nothing shows a width: firing again shows nothing more
    assert not fire_again(16, 14, 3, 2, 1.0, 60.0)  # fired again twice already
    assert not fire_again(16, 14, 1, 2, 61.0, 60.0)  # out of time
    assert not fire_again(1, 0, 1, 2, 1.0, 60.0)


@pytest.mark.parametrize("options, said", [({"refire": -1}, "refire must be a whole number of times >= 0, got -1"),
                                           ({"refire_s": -1.0}, "refire_s must be a number of seconds >= 0")])
def test_refire_settings_no_run_can_be_made_of_are_refused(options, said):
    with pytest.raises(ProbeError, match=said):
        ProbeSettings(prompts=["x"], **options)


def test_the_next_step_for_an_unformed_bia_serve_band_names_bia_serves_own_window():
    class Subject:
        label, ladder = "runs/certify", [1, 4, 16]
        manifest = {"effective": {"kernel_mode": "row-invariant", "batch_window_ms": 50.0}, "url": "http://127.0.0.1:8000/v1/chat/completions"}

    row = {"engine": "bia serve", "verdict": "UNVERIFIED", "cause": None, "missing": 0, "cs_missing": [], "requests": 300,
           "bands_unformed": 1, "bits_unknown": 0}
    step = next_step(Subject(), row)
    assert step == "let the requests sent together decode in one batch: bia serve --batch-window-ms 200, then certify again"
    assert "--batch-window-ms" in bia("serve", "--help").stdout  # a setting bia serve has
    Subject.manifest = {"effective": {"max_batch": 8}}
    assert next_step(Subject(), row) == "raise the batch limit so each c forms: bia serve --max-batch 16"
    assert "--max-batch" in bia("serve", "--help").stdout


# ---- against bia serve ----

@pytest.mark.engine
def test_an_idle_engine_waits_its_window_so_requests_sent_apart_decode_in_one_batch():
    pytest.importorskip("torch")
    from analysis.experiment import bundled_model
    from analysis.experiment.model import load_model
    from analysis.serve import Engine

    model = load_model(bundled_model(), __import__("torch").float32, "cpu")

    async def scenario(**options):
        engine, widths = Engine(model, "row-invariant", **options), []
        engine.on_step = widths.append
        loop = asyncio.create_task(engine.run())
        pending = []
        for _ in range(4):  # four requests 20 ms apart: within a window of 1 s of each other
            pending.append(await engine.submit(model.encode("If the argument is"), 4, 1))
            await asyncio.sleep(0.02)
        for request in pending:
            while not (await request.events.get())["done"]:
                pass
        loop.cancel()
        return widths

    assert asyncio.run(scenario(batch_window_ms=1000)) == [4, 4, 4, 4]  # one batch of 4 from the first step
    capped = asyncio.run(scenario(batch_window_ms=1000, max_batch=2))
    assert max(capped) == 2 and sum(capped) == 16  # never more than 2 rows a step; every token decoded
    with pytest.raises(ValueError, match="max_batch must be an integer >= 1"):
        Engine(model, "row-invariant", max_batch=0)


@pytest.mark.engine
def test_health_reports_the_window_and_a_ladder_wider_than_max_batch_is_refused(tmp_path):
    pytest.importorskip("torch")
    import httpx

    from analysis.serve import BackgroundServer

    with BackgroundServer("row-invariant", batch_window_ms=20, max_batch=3) as server:
        health = httpx.get(f"{server.url}/health", timeout=30).json()
        assert (health["batch_window_ms"], health["max_batch"]) == (20.0, 3)
        with pytest.raises(ProbeError, match=r"wider than the 3 requests the server runs at once .*bia serve --max-batch"):
            asyncio.run(probe(server.url, tmp_path / "run", prompts=["If the argument is"], ladder=(1, 4), max_tokens=4))
    done = bia("serve", "--batch-window-ms", "inf", "--port", "0")
    assert done.returncode == 2 and "--batch-window-ms takes a number of milliseconds >= 0, got inf" in done.stderr


@pytest.mark.engine
def test_a_band_seen_narrower_than_its_c_is_fired_again_and_only_its_last_attempt_is_kept(tmp_path):
    pytest.importorskip("torch")
    from analysis.serve import BackgroundServer

    said = []
    # --max-batch 3 under a band of 4: never formed, whatever the load; engine="openai" so that the probe does not refuse the
    # ladder for it (a plain server says nothing of its slots), while bia serve's log still gives every step's width
    with BackgroundServer("row-invariant", log_file=tmp_path / "serve.log", max_batch=3) as server:
        folder = asyncio.run(probe(server.url, tmp_path / "run", prompts=["If the argument is"], ladder=(1, 4), max_tokens=6,
                                   engine="openai", server_log=tmp_path / "serve.log", layout=ROTATING, say=said.append))
    manifest = json.loads((folder / "manifest.json").read_text())
    band = next(e for e in manifest["m_formed"] if e["c"] == 4)
    assert [a["widest"] for a in band["attempts"]] == [3, 3, 3] and max(band["widths"]) == 3  # fired, then 2 more
    assert [line for line in said if "fired again" in line] == [
        f"p0/band/c4/r0: the widest batch seen was m=3, narrower than c=4; fired again ({k} of 2)" for k in (1, 2)]
    run = read_run(folder)  # one capture line per request of the plan: the attempts set aside are not written
    assert run.missing() == [] and run.dump.requests.height == 2 + 1 + 4
    lines = [json.loads(line) for line in (folder / "captures" / "requests.jsonl").read_text().splitlines()]
    band_lines = sorted((line["row"], line["role"], line["slot"]) for line in lines if line.get("c") == 4)
    assert band_lines == [(0, "filler", 0), (1, "band", 0), (2, "band", 1), (3, "band", 2)]  # repeat 0: the companion at row 0
    companion = batch_id("Write one sentence about the sea.", {})  # one prompt: bia's first filler, named by its hash
    assert {tuple(line["batch"]) for line in lines if line.get("c") == 4} == {(companion, "p0", "p0", "p0")}
    assert not any((folder / "partial").iterdir())


# ---- the same server, the same verdict (issue 40): 3 certificates a mode, under a busy CPU ----

@pytest.fixture
def busy_cpu():
    """Two processes that keep both cores busy for the test's length."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for hog in hogs:
        hog.kill()
        hog.wait()


@pytest.mark.engine
@pytest.mark.parametrize("mode, verdict, code", [("row-invariant", "GREEN", 0), ("default", "RED", 5)])
def test_bia_serve_certified_three_times_under_a_busy_cpu_gives_the_same_verdict(tmp_path, busy_cpu, mode, verdict, code):
    pytest.importorskip("torch")
    from analysis.serve import BackgroundServer

    got = []
    with BackgroundServer(mode, log_file=tmp_path / "serve.log") as server:
        for attempt in range(3):
            done = bia("certify", server.url, "--run", str(tmp_path / f"run{attempt}"), "-o", str(tmp_path / f"c{attempt}.json"),
                       "--server-log", str(tmp_path / "serve.log"), timeout=900)
            document = json.loads((tmp_path / f"c{attempt}.json").read_text())
            got.append((document["verdict"], done.returncode, document["arms"][0]["reason"]))
    assert [(v, c) for v, c, _ in got] == [(verdict, code)] * 3, got
