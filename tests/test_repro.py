"""bia repro (issue 43): a RED run's first parting request shrunk against the live server into repro.py, REPORT.md and a
minimal run; against bia serve on loopback (default mode parts, row-invariant does not) and a server that parts at random."""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import sys
import threading
import time

import pytest
from _cli import ROOT, bia
from loopback import HttpServer, Quiet

from analysis import ReproError, judge, read_run, repro
from analysis.probe import probe
from analysis.serve import BackgroundServer

DEFAULT_RUN = ROOT / "data" / "experiment-cpu" / "default"


def _script(folder, *args):
    return subprocess.run(
        [sys.executable, str(folder / "repro.py"), *args], capture_output=True, text=True, timeout=120
    )


def test_without_a_server_the_runs_own_first_part_is_written_with_its_bits(tmp_path):
    found = repro(DEFAULT_RUN, out=tmp_path / "r", say=lambda line: None)
    first = judge(DEFAULT_RUN).to_dicts()[0]["first_request"]
    assert found.reproduced and found.case["c"] == first["c"] and found.case["position"] == first["position"]
    report = found.report.read_text()
    assert report.startswith("# bia torch (analysis.experiment): parts in a batch of 4")
    assert '"content": "If the argument is"' in report and '"max_tokens": 64' in report
    bits = [line for line in report.splitlines() if " bits 0x" in line]
    assert (
        len(bits) == 2 and bits[0].split("bits ")[1] != bits[1].split("bits ")[1]
    )  # the two sides' float32 bits differ
    compile(found.script.read_text(), "repro.py", "exec")
    assert not found.run.exists()  # nothing fired: no minimal run
    assert _script(tmp_path / "r").returncode == 2  # an in-process run has no URL: the script says to give one


def test_a_run_with_nothing_parted_or_a_request_it_lacks_is_refused_by_name(tmp_path):
    with pytest.raises(ReproError, match="no request parts from m=1 .*nothing to reproduce"):
        repro(ROOT / "data" / "experiment-cpu" / "batch-invariant", out=tmp_path / "a")
    with pytest.raises(ReproError, match="--request takes PROMPT_ID/C/REPEAT/SLOT"):
        repro(DEFAULT_RUN, out=tmp_path / "b", request="p0")
    with pytest.raises(ReproError, match="holds no batched request p9 c=2"):
        repro(DEFAULT_RUN, out=tmp_path / "c", request="p9/2/0/0")
    with pytest.raises(ReproError, match="tries must be a whole number >= 1"):
        repro(DEFAULT_RUN, out=tmp_path / "d", tries=0)
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "x").write_text("")
    with pytest.raises(ReproError, match="already holds something"):
        repro(DEFAULT_RUN, out=tmp_path / "e")


def test_the_command_says_each_bad_input_with_its_exit_code(tmp_path):
    missing = bia("repro", str(tmp_path / "nope"), "-o", str(tmp_path / "o"))
    assert missing.returncode == 3 and "no run there" in missing.stderr
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{")
    assert bia("repro", str(tmp_path / "bad"), "-o", str(tmp_path / "o")).returncode == 4
    green = bia("repro", str(ROOT / "data" / "experiment-cpu" / "batch-invariant"), "-o", str(tmp_path / "o"))
    assert green.returncode == 2 and "nothing to reproduce" in green.stderr
    done = bia("repro", str(DEFAULT_RUN), "-o", str(tmp_path / "o"))
    assert done.returncode == 0 and (tmp_path / "o" / "REPORT.md").is_file(), done.stderr


@pytest.mark.engine
def test_a_red_run_of_bia_serve_shrinks_to_c2_and_its_script_parts_there_and_not_on_row_invariant(tmp_path):
    with BackgroundServer("default") as server:
        asyncio.run(
            probe(
                server.url,
                tmp_path / "run",
                prompts=["If the argument is", "Write one sentence about the sea."],
                ladder=(1, 2, 4),
                max_tokens=16,
                progress=False,
                say=lambda line: None,
            )
        )
        first = judge(tmp_path / "run").to_dicts()[0]["first_request"]
        lines: list[str] = []
        started = time.monotonic()
        found = repro(tmp_path / "run", server.url, tmp_path / "r", say=lines.append)
        spent = time.monotonic() - started
        parts = _script(tmp_path / "r")
    print(
        f"bia serve default: {found.requests} requests, {spent:.1f} s: {found.outcome}"
    )  # the note's figures (pytest -s)
    assert found.reproduced and found.case["c"] == 2
    assert found.case["max_tokens"] <= first["position"] + 1  # no more tokens than the first parting token needs
    assert len(found.case["prompt"]) <= len("If the argument is") and found.requests <= 400
    assert any("parted in 3 of 3 tries" in line for line in lines) and lines[0].startswith("repro: ")
    minimal = judge(found.run).to_dicts()[0]  # the minimal run is a run like any other: RED at c=2
    assert minimal["verdict"] == "RED" and minimal["first_request"]["c"] == 2
    assert parts.returncode == 1, parts.stdout + parts.stderr
    assert parts.stdout.startswith("PARTS") and parts.stdout.count(" bits 0x") == 2
    report = found.report.read_text()
    assert "- engine: bia serve (bia's profile `bia`" in report and '"kernel_mode": "default"' in report
    assert json.dumps(found.case["prompt"]) in report and f'"max_tokens": {found.case["max_tokens"]}' in report
    assert (
        report.count(" bits 0x") == 2
        and "## What shrinking tried" in report
        and "c=2: parted in 3 of 3 tries" in report
    )
    assert len(read_run(found.run).manifest["prompts"]) == 1
    with BackgroundServer("row-invariant") as fixed:
        held = _script(tmp_path / "r", "--url", fixed.url)
    assert held.returncode == 0 and held.stdout.startswith("no part in 3 tries"), held.stdout + held.stderr


class Flaky:
    """A loopback chat server whose batches (requests streaming at once) part from the requests alone at random, one batch in
    three: a seeded draw per batch, so the run and the shrink see the same sequence of parts; requests alone always answer
    the same."""

    def __init__(self, seed: int = 1) -> None:
        self.running, self.lock, self.draws, self.parted = 0, threading.Lock(), random.Random(seed), 0
        self.batch, self.decided = 0, {}  # the batch in flight (a new one each time the server was idle), and its draw
        flaky = self

        class Handler(Quiet):
            protocol_version = "HTTP/1.0"

            def do_GET(self):
                if self.path == "/v1/models":
                    self.answer(
                        200, json.dumps({"object": "list", "data": [{"id": "m", "owned_by": "someone"}]}).encode()
                    )
                else:
                    self.answer(404, b"{}")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with flaky.lock:
                    flaky.running += 1
                    flaky.batch += flaky.running == 1
                    mine = flaky.batch
                try:
                    time.sleep(0.15)  # long enough for a band's requests to be in flight together
                    with flaky.lock:
                        if flaky.running > 1 and mine not in flaky.decided:
                            flaky.decided[mine] = flaky.draws.random() < 1 / 3
                            flaky.parted += flaky.decided[mine]
                        part = flaky.decided.get(mine, False)
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for step in range(body["max_tokens"]):
                        value = -0.25 - (1e-6 if part and step == 1 else 0.0)
                        entry = {
                            "token": f"t{step}",
                            "logprob": value,
                            "top_logprobs": [{"token": f"t{step}", "logprob": value}],
                        }
                        chunk = {
                            "choices": [
                                {"index": 0, "delta": {"content": f"t{step}"}, "logprobs": {"content": [entry]}}
                            ]
                        }
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.write(b"data: [DONE]\n\n")
                finally:
                    with flaky.lock:
                        flaky.running -= 1

        self.handler = Handler


@pytest.mark.engine
def test_a_part_seen_in_only_some_tries_ends_not_reproducible_rather_than_a_wrong_minimal_case(tmp_path):
    flaky = Flaky()
    with HttpServer(flaky.handler) as server:
        asyncio.run(
            probe(
                server.url,
                tmp_path / "run",
                prompts=["one two three four"],
                ladder=(1, 2),
                repeats=8,
                max_tokens=4,
                progress=False,
                metrics=False,
                refire=0,
                say=lambda line: None,
            )
        )
        assert judge(tmp_path / "run").to_dicts()[0]["verdict"] == "RED"  # the run saw a part
        lines: list[str] = []
        before = flaky.parted
        found = repro(tmp_path / "run", server.url, tmp_path / "r", tries=3, say=lines.append)
        during = flaky.parted - before
        done = bia("repro", str(tmp_path / "run"), "--url", server.url, "-o", str(tmp_path / "cli"), "--tries", "3")
    assert not found.reproduced and found.outcome == "not reproducible at 3 tries"
    assert not found.script.exists() and not found.run.exists()
    seen = [tuple(map(int, m.groups())) for m in map(re.compile(r"parted in (\d+) of (\d+) tries").search, lines) if m]
    assert seen and all(parted < tried for parted, tried in seen), lines  # no candidate parted in every try
    assert during and any(parted for parted, _ in seen), (
        lines
    )  # the server did part while shrunk: in some tries, not all
    report = found.report.read_text()
    assert report.splitlines()[0].endswith(": not reproducible at 3 tries")
    assert "## The minimal request" not in report and "c=2: parted in" in report
    assert "## Engine, as the run recorded it" in report and "- model: `m`" in report  # what was tried, and on what
    assert done.returncode == 7 and "not reproducible at 3 tries" in done.stdout, done.stdout + done.stderr


@pytest.mark.engine
def test_on_a_warm_llama_server_with_its_prompt_cache_the_repro_is_alone_and_parts_and_not_without_the_cache(
    tmp_path, server_binary
):
    """The bundled cache-prompt run parts alone (ref #2 came from the cache). Both prompts are put in the cache first, so a
    repro that sent the same request twice would find both sides cached and nothing parting: the first send skips the cache
    (``cache_prompt: false``), the compared one is served from it (only its last prompt token evaluated, alone)."""
    pytest.importorskip("gguf")
    pytest.importorskip("torch")
    from analysis.experiment import DEFAULT_PROMPTS, bundled_model
    from analysis.experiment.engines import MODEL_ALIAS, llama_server, write_gguf

    model = write_gguf(bundled_model(), tmp_path / "tiny.gguf")
    run = ROOT / "data" / "llamacpp-cpu" / "cache-prompt"
    assert judge(run).to_dicts()[0]["cause"] == "prompt cache"
    with llama_server(model, binary=server_binary, parallel=16, cache_prompt=True) as url:
        import httpx

        for prompt in DEFAULT_PROMPTS:  # a warm server: the prompts are in its cache already
            body = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
            httpx.post(url + "/v1/chat/completions", json=body, timeout=60).raise_for_status()
        lines: list[str] = []
        started = time.monotonic()
        found = repro(run, url, tmp_path / "r", say=lines.append)
        spent = time.monotonic() - started
        parts = _script(tmp_path / "r")
    print(
        f"llama-server, prompt cache: {found.requests} requests, {spent:.1f} s: {found.outcome}"
    )  # the note's figures
    assert found.reproduced and found.case["c"] == 1 and found.case["row"] is None, lines
    assert (
        found.case["max_tokens"] == 1 and found.case["prompt"] == "If"
    )  # token 0 parts; one word still templated to many
    assert parts.returncode == 1 and "the request on the warm cache parts from the one sent cold" in parts.stdout, (
        parts.stdout
    )
    assert parts.stdout.count(" bits 0x") == 2
    script = found.script.read_text()
    assert "'cold': {'cache_prompt': False}" in script and "'cache_prompt'" not in script.split("'cold'")[0]
    report = found.report.read_text()
    assert report.startswith("# llama.cpp server: parts alone, run to run")
    assert "- engine: llama.cpp server (bia's profile `llamacpp`" in report and "- version: b1-" in report
    assert '"content": "If"' in report and '`{"cache_prompt": false}`' in report and "served from that cache" in report
    bits = [line.split("bits ")[1] for line in report.splitlines() if " bits 0x" in line]
    assert len(bits) == 2 and bits[0] != bits[1]
    with llama_server(model, binary=server_binary, parallel=16, cache_prompt=False) as url:
        held = _script(tmp_path / "r", "--url", url)
    assert held.returncode == 0 and "matches the one sent cold" in held.stdout, held.stdout + held.stderr


@pytest.mark.parametrize("way", ["padded", "continuous"])
def test_a_bundled_transformers_run_gets_an_in_process_script_that_parts(tmp_path, way):
    """bia experiment --hf made these runs in process: repro.py loads the same checkpoint with transformers (bia's model
    written as a GPT-2 checkpoint beside it) and calls it alone and in the run's batch, through the functions the run was
    probed with, copied into the script."""
    pytest.importorskip("transformers")
    run = ROOT / "data" / "transformers-cpu" / way
    found = repro(run, out=tmp_path / "r")
    first = judge(run).to_dicts()[0]["first_request"]
    assert found.reproduced and found.case["c"] == first["c"] == 4 and found.case["row"] == first["slot"]
    assert (tmp_path / "r" / "checkpoint" / "config.json").is_file() and not found.run.exists()
    script = found.script.read_text()
    assert "def padded_generate(" in script and "import analysis" not in script and "from analysis" not in script
    env = {"MKL_CBWR": "AVX2", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}  # the run's MKL code path and threads
    (tmp_path / "r").rename(tmp_path / "moved")  # attached elsewhere: the checkpoint beside the script goes with it
    moved = tmp_path / "moved" / "repro.py"
    parts = subprocess.run(
        [sys.executable, str(moved)], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert parts.returncode == 1 and parts.stdout.startswith("PARTS"), parts.stdout + parts.stderr
    report = (tmp_path / "moved" / "REPORT.md").read_text()
    assert report.startswith(f"# transformers 5.24.0 ({way} batching): parts in a batch of 4")
    assert f"- engine: transformers 5.24.0 ({way} batching)" in report and "- model: `tiny_lm`" in report
    assert '"prompt": "If the argument is"' in report and '"row": 0' in report and '"max_new_tokens": 64' in report
    printed = [line.rsplit("bits ", 1)[1] for line in parts.stdout.splitlines() if " bits 0x" in line]
    written = [line.rsplit("bits ", 1)[1] for line in report.splitlines() if " bits 0x" in line]
    assert len(printed) == len(written) == 2 and printed[0] != printed[1]  # on any machine: alone and batched part
    if printed[0] != written[0]:  # another CPU's kernels (the run was recorded on an x86-64 with MKL's AVX2 path)
        pytest.skip(f"this CPU computes the request alone to {printed[0]}, not the run's {written[0]}: not its bits")
    assert printed == written  # the script shows the bits the run recorded


TOY = '''
import os


def generate(prompts):
    """Greedy and deterministic; in a batch (unless TOY_FIXED is set) token 1's logprob moves by 2**-20."""
    shift = 0.0 if len(prompts) == 1 or os.environ.get("TOY_FIXED") else 2.0**-20
    return [{"token_ids": [1, 2, 3], "logprobs": [-0.5, -0.25 - shift, -0.125]} for _ in prompts]
'''


def test_a_run_of_the_users_generate_gets_a_script_that_imports_it_and_exits_0_once_fixed(tmp_path, monkeypatch):
    from analysis import probe_callable

    (tmp_path / "toyengine.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import toyengine

    probe_callable(toyengine.generate, ["one two"], tmp_path / "run", ladder=(1, 2), progress=False)
    with pytest.raises(ReproError, match="give generate='module:function'"):
        repro(tmp_path / "run", out=tmp_path / "none")
    with pytest.raises(ReproError, match="--generate takes MODULE:FUNCTION"):
        repro(tmp_path / "run", out=tmp_path / "bad", generate="toyengine.generate")
    with pytest.raises(ReproError, match="made in process, by no server"):
        repro(tmp_path / "run", "http://127.0.0.1:9", out=tmp_path / "url", generate="toyengine:generate")
    found = repro(tmp_path / "run", out=tmp_path / "r", generate="toyengine:generate")
    assert found.case["c"] == 2 and "`generate` (toyengine:generate) called in process" in found.report.read_text()

    def script(**env):
        return subprocess.run(
            [sys.executable, str(found.script)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={"PATH": "/usr/bin:/bin", **env},
        )

    parts, fixed, elsewhere = (
        script(),
        script(TOY_FIXED="1"),
        subprocess.run(
            [sys.executable, str(found.script)], capture_output=True, text=True, timeout=60, cwd=tmp_path / "r"
        ),
    )
    assert parts.returncode == 1 and "token 1, the chosen token" in parts.stdout, parts.stdout + parts.stderr
    assert fixed.returncode == 0 and fixed.stdout.startswith("no part in 1 tries"), fixed.stdout + fixed.stderr
    assert elsewhere.returncode == 2 and "No module named 'toyengine'" in elsewhere.stderr  # said, not a traceback


def test_a_red_rows_repro_is_named_by_the_answer_and_the_card_and_linked_once_written_beside_the_run(tmp_path):
    """One source: the judgement's ``repro`` (studies.repro_step, into RUN-repro); the answer table's next step and the run's
    card render it, the card links the REPORT.md once bia repro wrote it beside the run, and a folder scan leaves the runs
    inside a repro folder out of the study."""
    import shutil

    from analysis.run import read_run as read
    from analysis.studies import repro_folder, repro_step, run_directories
    from analysis.views.html import answer_html, reviews_html
    from analysis import read_witnesses

    run = tmp_path / "runs" / "default"
    shutil.copytree(DEFAULT_RUN, run, ignore=shutil.ignore_patterns("derived"))
    (row,) = judge(run).to_dicts()
    assert row["repro"] == repro_step(str(run)) == f"bia repro {run} -o {run}-repro"
    assert judge(ROOT / "data" / "experiment-cpu" / "row-invariant").to_dicts()[0]["repro"] is None  # AMBER: no repro
    padded = judge(ROOT / "data" / "transformers-cpu" / "padded").to_dicts()[0]["repro"]
    assert padded.endswith("transformers-cpu/padded-repro") and "--generate" not in padded  # transformers: bia calls it
    assert f"<br>repro: <code>bia repro {run} -o {run}-repro</code></td>" in answer_html(
        judge(run), full=True
    )  # Jupyter
    assert f'; repro: bia repro {run} -o {run}-repro">batch-invariant kernels: ' in answer_html(
        judge(run)
    )  # the report
    served = judge(ROOT / "data" / "llamacpp-cpu" / "cache-prompt").to_dicts()[0]["repro"]
    assert (
        served.startswith("bia repro ") and " --url run -o " in served
    )  # the URL the run recorded, which bia repro reads

    def card() -> str:
        return reviews_html(read_witnesses([]), [read(run)], epsilon=0.05)

    assert f"<dt>repro</dt><dd>bia repro {run} -o {run}-repro</dd>" in card() and "REPORT.md" not in card()
    done = bia("repro", str(run))  # the default folder: beside the run
    assert done.returncode == 0 and (tmp_path / "runs" / "default-repro" / "REPORT.md").is_file(), done.stderr
    assert repro_folder(str(run)) == f"{run}-repro"
    written = tmp_path / "runs" / "default-repro" / "REPORT.md"
    assert f'<a href="{written.as_uri()}">written beside the run: {written} (repro.py beside it)</a>' in card()
    shutil.copytree(DEFAULT_RUN, tmp_path / "runs" / "default-repro" / "run")  # as a shrink writes its minimal run
    assert run_directories(tmp_path / "runs") == [run]
    assert run_directories(tmp_path / "runs" / "default-repro") == [tmp_path / "runs" / "default-repro" / "run"]
