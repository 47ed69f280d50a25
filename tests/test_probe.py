"""bia probe against real loopback servers: engine detection and profiles, gauge sampling, layouts,
the observer check, and runs that are stopped and resumed."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import signal
import subprocess
import threading
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from _cli import bia, start_bia
from loopback import HttpServer, Quiet, routes, stream_words

from analysis.dumps._sse import parse_sse
from analysis.probe import PROFILES, EventClock, ProbeError, detect_engine, probe, request_body, stream_problem
from analysis.run import band_table, observer_table, read_run, slot_table, to_witness

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _json(body) -> callable:
    return lambda handler: handler.answer(200, json.dumps(body).encode())


async def _detect(url: str, engine: str = "auto"):
    import httpx

    async with httpx.AsyncClient(timeout=5) as client:
        return await detect_engine(client, url, engine)


@pytest.mark.parametrize(
    ("table", "expected", "evidence"),
    [
        ({"GET /v1/models": _json({"data": [{"id": "qwen3", "owned_by": "vllm"}]})}, "vllm", "owned_by 'vllm'"),
        ({"GET /v1/models": _json({"data": [{"id": "qwen3", "owned_by": "sglang"}]})}, "sglang", "owned_by 'sglang'"),
        ({"GET /v1/models": _json({"data": [{"id": "m.gguf", "owned_by": "llamacpp"}]})}, "llamacpp", "owned_by 'llamacpp'"),
        ({"GET /version": _json({"version": "0.11.0"})}, "vllm", "GET /version"),
        ({"GET /get_server_info": _json({"model_path": "Qwen/Qwen3", "tp_size": 1})}, "sglang", "GET /get_server_info"),
        ({"GET /props": _json({"default_generation_settings": {}, "total_slots": 4})}, "llamacpp", "GET /props"),
        ({"GET /metrics": lambda h: h.answer(200, b"sglang:num_running_reqs 0\n", "text/plain")}, "sglang", "metric names start with 'sglang:'"),
        ({"GET /v1/models": _json({"data": [{"id": "gpt-x", "owned_by": "someone"}]})}, "openai", None),
        ({}, "openai", None),
    ],
)
def test_engine_detection_reads_only_what_servers_expose(table, expected, evidence):
    with HttpServer(routes(table)) as server:
        found = asyncio.run(_detect(server.url))
    assert found.profile.name == expected
    if evidence is None:
        assert found.evidence == () and "nothing identified the engine" in found.describe()
    else:
        assert any(evidence in e for e in found.evidence)


def test_an_engine_given_overrides_detection_and_a_wrong_name_is_refused():
    table = {"GET /v1/models": _json({"data": [{"id": "qwen3", "owned_by": "vllm"}]})}
    with HttpServer(routes(table)) as server:
        found = asyncio.run(_detect(server.url, "llamacpp"))
        assert found.profile.name == "llamacpp" and found.model == "qwen3"
        with pytest.raises(ValueError, match="engine must be 'auto' or one of"):
            asyncio.run(_detect(server.url, "tgi"))


def test_request_bodies_by_profile():
    vllm = request_body("p", max_tokens=4, top_logprobs=5, profile=PROFILES["vllm"])
    plain = request_body("p", max_tokens=4, top_logprobs=5, profile=PROFILES["openai"])
    assert vllm["return_tokens_as_token_ids"] is True and vllm["ignore_eos"] is True
    assert "ignore_eos" not in plain and "return_tokens_as_token_ids" not in plain
    assert plain | {"ignore_eos": True, "return_tokens_as_token_ids": True} == vllm
    bare = request_body("p", max_tokens=4, top_logprobs=5, profile=PROFILES["vllm"], logprobs=False)
    assert not {"logprobs", "top_logprobs", "return_tokens_as_token_ids"} & set(bare)


class FakeVllm:
    """A loopback server that answers like vLLM: token ids as ``token_id:N`` only when asked, and a
    running-requests gauge that counts the requests it is streaming at that moment."""

    def __init__(self, tokens: int = 6, hold: float = 0.3) -> None:
        self.running, self.bodies, self.lock = 0, [], threading.Lock()
        self.hits = self.queries = 0  # a prefix cache: 3 prompt tokens per request, a hit when the prompt was seen before
        self.peak = 0  # the most requests it streamed at once
        fake = self

        class Handler(Quiet):
            protocol_version = "HTTP/1.0"

            def do_GET(self):
                if self.path == "/v1/models":
                    self.answer(200, json.dumps({"object": "list", "data": [{"id": "Qwen/Qwen3-0.6B", "owned_by": "vllm"}]}).encode())
                elif self.path == "/metrics":
                    text = (f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="Qwen/Qwen3-0.6B"}} {fake.running}.0\n'
                            f'# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{{model_name="Qwen/Qwen3-0.6B"}} {fake.hits}.0\n'
                            f'# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{{model_name="Qwen/Qwen3-0.6B"}} {fake.queries}.0\n')
                    self.answer(200, text.encode(), "text/plain; version=0.0.4")
                else:
                    self.answer(404, b"{}")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    seen = any(b["messages"] == body["messages"] for b in fake.bodies)
                    fake.bodies.append(body)
                    fake.running += 1
                    fake.peak = max(fake.peak, fake.running)
                    fake.queries += 3
                    fake.hits += 3 if seen else 0
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    time.sleep(hold)  # the batch is "running": the gauge shows it
                    as_ids = body.get("return_tokens_as_token_ids")
                    for step in range(tokens):
                        token = f"token_id:{100 + step}" if as_ids else f"t{step}"
                        entry = {"token": token, "logprob": -0.5, "bytes": list(token.encode()),
                                 "top_logprobs": [{"token": token, "logprob": -0.5, "bytes": list(token.encode())}]}
                        chunk = {"id": "x", "object": "chat.completion.chunk", "model": "Qwen/Qwen3-0.6B",
                                 "choices": [{"index": 0, "delta": {"content": f"t{step}"}, "logprobs": {"content": [entry]},
                                              "finish_reason": "length" if step == tokens - 1 else None}]}
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    usage = {"id": "x", "object": "chat.completion.chunk", "choices": [],
                             "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens}}
                    self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
                finally:
                    with fake.lock:
                        fake.running -= 1

        self.handler = Handler


def test_probe_of_a_vllm_like_server_asks_for_token_ids_and_samples_its_gauge(tmp_path):
    fake = FakeVllm()
    said = []
    with HttpServer(fake.handler) as server:
        folder = asyncio.run(probe(server.url, tmp_path / "run", prompts=["Hello"], ladder=(1, 4), max_tokens=6, declared_min=4,
                                   metrics_interval=0.02, say=said.append))
    run = read_run(folder)
    assert said == [run.manifest["engine"]["said"]] and said[0].startswith("engine: vLLM (GET /v1/models: owned_by 'vllm')")
    assert {b["model"] for b in fake.bodies} == {"Qwen/Qwen3-0.6B"} and all(b["return_tokens_as_token_ids"] for b in fake.bodies)
    assert run.dump.tokens["token_id"].unique().sort().to_list() == list(range(100, 106))  # the placeholders became ids
    entries = {e["c"]: e for e in run.manifest["m_formed"]}
    assert entries[1]["widths"] == [] and entries[1]["running_metric"] == "vllm:num_requests_running"
    assert max(entries[4]["running"]) == 4 and max(entries[1]["running"]) == 1  # the whole distribution of samples is kept
    bands = band_table(run)
    assert bands.filter(bands["c"] == 4)["m_formed"].to_list() == [4]
    assert "gauge samples" in bands.filter(bands["c"] == 4)["widths_seen"][0]
    assert to_witness(run, "p0")["bands"][1]["m_formed"] == 4
    # the prefix cache, read before and after each band: every batched request hit it (the references had seen the prompt)
    assert entries[4]["cache"]["vllm:prefix_cache_hits_total"]["after"] - entries[4]["cache"]["vllm:prefix_cache_hits_total"]["before"] == 12
    assert entries[1]["cache"]["vllm:prefix_cache_queries_total"] == {"before": 6.0, "after": 9.0}
    assert bands.filter(bands["c"] == 4)["prefix_cache"][0] == "vllm:prefix_cache_hits_total +12; vllm:prefix_cache_queries_total +12"
    per_1000 = dict(bands.select("c", "s_per_1000_seq").rows())
    assert per_1000[1] >= 300 and per_1000[4] < per_1000[1]  # each answer takes 0.3 s; four at once share the wait


@st.composite
def _sse_and_cuts(draw):
    line_end = draw(st.sampled_from(["\n", "\r", "\r\n"]))
    kinds = ["data: {}", "data: é€😀", ": comment", "event: x\ndata: a\ndata: b", "data", "dataX: 1", "id: 7", "data: [DONE]", "data:[DONE]",
             "data: [DONE]\ndata:", 'data: {"error": {"message": "OOM"}}', "event: error\ndata: x", "event: error", "data:\ndata: {\"error\": 1}"]
    events = draw(st.lists(st.tuples(st.sampled_from(kinds), st.sampled_from(["\n", "\n", "\r", "\r\n"])), max_size=8))  # mostly LF, as servers send
    text = draw(st.sampled_from(["", "\ufeff"])) + "".join(e.replace("\n", end) + end * 2 for e, end in events)
    text += draw(st.sampled_from(["", "data: {\"cut", ": trailing comment", "data: x" + line_end]))
    raw = text.encode()
    cuts = sorted(draw(st.sets(st.integers(0, len(raw)), max_size=6)))
    return text, raw, cuts


@settings(max_examples=examples(300), deadline=None)
@given(_sse_and_cuts())
def test_event_clock_counts_what_the_reader_reads(case):
    """However the bytes are split (inside a line ending, inside a UTF-8 character), the clock stamps
    exactly the events the dump reader parses, each at the read that completed it, and judges the
    stream as a second full parse would."""
    text, raw, cuts = case
    clock = EventClock()
    bounds = [0, *cuts, len(raw)]
    for k, (a, b) in enumerate(itertools.pairwise(bounds)):
        clock.feed(raw[a:b], float(k))
    clock.finish(float(len(bounds)))
    assert len(clock.arrivals) == len(parse_sse(text).events)
    assert clock.problem() == stream_problem(text)
    assert clock.arrivals == sorted(clock.arrivals)


@pytest.mark.engine
def test_needle_layout_records_the_target_and_keeps_the_fillers(tmp_path):
    pytest.importorskip("torch")
    from analysis.serve import BackgroundServer

    # the server log gives every step's width; a 50 ms gauge sample can miss a band this short and leave it unmeasurable
    with BackgroundServer("fixed-tiles", log_file=tmp_path / "serve.log") as server:
        folder = asyncio.run(probe(server.url, tmp_path / "run", prompts=["If the argument is"], ladder=(1, 3), max_tokens=6, top_logprobs=2,
                                   declared_min=4, layout="needle", fillers=["This function returns", "Return the"],
                                   server_log=tmp_path / "serve.log"))
    run = read_run(folder)
    roles = run.dump.requests.group_by("role").len().sort("role").rows()
    assert roles == [("band", 2), ("filler", 2), ("reference", 2)] and run.missing() == []
    texts = {r["completion_text"] for r in run.dump.requests.filter(run.dump.requests["role"] == "filler").iter_rows(named=True)}
    assert len(texts) >= 1
    extra = [json.loads(e) for e in run.dump.requests.filter(run.dump.requests["role"] == "band")["extra"]]
    assert sorted(e["batch_row"] for e in extra)[1] in (0, 1, 2)
    witness = to_witness(run, "p0")
    assert [b["result"] for b in witness["bands"]] == ["PASS", "PASS"]  # fixed-tiles: the target matches m=1 among fillers
    assert (slot_table(run)["bitwise_prefix"] == 6).all()


class ObserverAffected:
    """A loopback server whose answer changes when logprobs are asked for: the effect the observer check exists to catch."""

    def __init__(self) -> None:
        class Handler(Quiet):
            protocol_version = "HTTP/1.0"

            def do_GET(self):
                self.answer(404, b"{}")

            def do_POST(self):
                ObserverAffected.answer_stream(self)

        self.handler = Handler

    @staticmethod
    def answer_stream(handler) -> None:
        """Three tokens as an SSE stream: "ab cd ef" with logprobs, "ab cX ef" without."""
        body = json.loads(handler.rfile.read(int(handler.headers["Content-Length"])))
        words = ["ab", "cd", "ef"] if body.get("logprobs") else ["ab", "cX", "ef"]
        stream_words(handler, words, logprobs=bool(body.get("logprobs")))


def test_observer_check_finds_a_server_whose_text_changes_without_logprobs(tmp_path):
    with HttpServer(ObserverAffected().handler) as server:
        folder = asyncio.run(probe(server.url, tmp_path / "run", prompts=["x"], ladder=(1, 2), max_tokens=3, declared_min=2, observer=True))
    run = read_run(folder)
    assert run.manifest["engine"]["profile"] == "openai" and run.missing() == []
    table = observer_table(run)
    assert table.select("c", "slot", "texts_equal", "first_difference").rows() == [(1, 0, False, 3), (2, 0, False, 3), (2, 1, False, 3)]
    assert table["text_with_logprobs"].to_list() == ["abcdef"] * 3 and table["text_without_logprobs"].to_list() == ["abcXef"] * 3
    assert observer_table(read_run(folder, stream=True)).equals(table)  # the texts read a piece at a time


@pytest.mark.engine
def test_observer_check_against_bia_serve_finds_no_effect(tmp_path):
    pytest.importorskip("torch")
    from analysis.views.html import run_tables_html
    from analysis.serve import BackgroundServer

    with BackgroundServer("default") as server:
        folder = asyncio.run(probe(server.url, tmp_path / "run", prompts=["If the argument is"], ladder=(1, 2), max_tokens=6, top_logprobs=2,
                                   declared_min=4, observer=True))
    run = read_run(folder)
    table = observer_table(run)
    assert table.height == 3 and table["texts_equal"].all()
    html = run_tables_html(run, epsilon=0.05)
    assert "All 3 request(s) fired without logprobs gave the same text as with them." in html


def test_a_run_directory_is_not_overwritten_and_only_a_probe_run_resumes(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"run_version": 1, "producer": "bia experiment"}))
    with pytest.raises(ProbeError, match="already holds a run"):
        asyncio.run(probe("http://127.0.0.1:9", folder, prompts=["x"]))
    with pytest.raises(ProbeError, match="not a run bia probe wrote"):
        asyncio.run(probe("http://127.0.0.1:9", folder, resume=True))
    with pytest.raises(ProbeError, match="no manifest.json to resume"):
        asyncio.run(probe("http://127.0.0.1:9", tmp_path / "empty", resume=True))


def _wait_for(condition, seconds: float = 90.0) -> None:
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, "timed out waiting"
        time.sleep(0.02)


def _in_flight(folder: Path, band: str) -> bool:
    partial = folder / "partial"
    return partial.is_dir() and any(band in p.name and p.stat().st_size > 0 for p in partial.glob("*.sse"))


@pytest.mark.engine
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_a_probe_stopped_mid_band_leaves_a_readable_run_that_resumes(tmp_path, how):
    pytest.importorskip("torch")
    from analysis.views.html import run_html
    from analysis.serve import BackgroundServer

    folder = tmp_path / "run"
    args = ["--ladder", "1,4,8", "--max-tokens", "40", "--top-logprobs", "2", "--prompts", str(tmp_path / "prompts.txt"), "--declared-min", "8"]
    (tmp_path / "prompts.txt").write_text("If the argument is\n")
    with BackgroundServer("one-by-one", log_file=tmp_path / "serve.log") as server:
        child = start_bia("probe", server.url, "-o", str(folder), "--server-log", str(tmp_path / "serve.log"), *args)
        try:
            _wait_for(lambda: _in_flight(folder, "band.c8"))
        finally:
            child.send_signal(how)
            _, stderr = child.communicate(timeout=60)
        if how == signal.SIGINT:
            assert child.returncode == 130 and "--resume" in stderr
        stopped = read_run(folder)
        assert stopped.manifest["complete"] is False
        assert stopped.manifest["done"] == ["p0/reference/s0", "p0/reference/s1", "p0/band/c1/r0", "p0/band/c4/r0"]
        missing = stopped.missing()
        assert {(m["c"], m["slot"]) for m in missing} >= {(8, s) for s in range(8)} - {
            (r["c"], r["slot"]) for r in stopped.dump.requests.iter_rows(named=True)}
        assert all(m["c"] == 8 for m in missing) and len(missing) <= 8
        assert any(m["state"] == "in flight when the probe stopped" for m in missing)  # their bytes so far are under partial/
        if how == signal.SIGINT:
            assert stopped.manifest["stopped"]["why"].startswith("cancelled (Ctrl-C")
        assert "request(s) never came back" in run_html(stopped)

        refused = start_bia("probe", server.url, "-o", str(folder), "--resume", "--ladder", "1,2", "--max-tokens", "40")
        assert refused.wait(timeout=60) == 2 and refused.communicate()[1] == (
            f"error: --ladder 1,2 differs from the run's 1,4,8: a resumed run keeps the settings in {folder / 'manifest.json'} (drop the "
            "option, or write a new run with another -o)\n")  # the one that differs named; --max-tokens 40 is the run's own
        # issue 32 item 6: the original command with --resume appended finishes the run (its settings are the manifest's)
        resumed = start_bia("probe", server.url, "-o", str(folder), "--server-log", str(tmp_path / "serve.log"), *args, "--resume")
        _, err = resumed.communicate(timeout=120)
        assert resumed.returncode == 0, err
    run = read_run(folder)
    assert run.manifest["complete"] is True and run.missing() == [] and len(run.manifest["resumed"]) == 1
    assert run.dump.requests.group_by("c").len().sort("c").rows() == [(None, 2), (1, 1), (4, 4), (8, 8)]
    assert [e["c"] for e in run.manifest["m_formed"]] == [1, 4, 8] and max(run.manifest["m_formed"][2]["widths"]) >= 2
    assert not list((folder / "partial").iterdir())
    moved = list((folder / "superseded").rglob("*"))
    assert moved, "what the stopped band had written is kept aside, not deleted"
    assert [b["result"] for b in to_witness(run, "p0")["bands"]] == ["PASS", "PASS", "PASS"]


class _Tables(HTMLParser):
    """Every <table> of a page as (the paragraph just before it, which table_html writes as its caption, header, rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[tuple[str, list[str], list[list[str]]]] = []
        self._paragraph: list[str] | None = None
        self._last_paragraph = ""
        self._cell: list[str] | None = None
        self._row: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append((self._last_paragraph, [], []))
        elif tag == "p":
            self._paragraph = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "tr":
            self._row = []

    def handle_endtag(self, tag):
        if tag == "p" and self._paragraph is not None:
            self._last_paragraph, self._paragraph = "".join(self._paragraph).strip(), None
        elif tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self.tables:
            _, header, rows = self.tables[-1]
            if header:
                rows.append(self._row)
            else:
                header.extend(self._row)

    def handle_data(self, data):
        for sink in (self._cell, self._paragraph):
            if sink is not None:
                sink.append(data)


def _table(html: str, caption_start: str) -> list[dict[str, str]]:
    parser = _Tables()
    parser.feed(html)
    _, header, rows = next(t for t in parser.tables if t[0].startswith(caption_start))
    return [dict(zip(header, row)) for row in rows]


@pytest.mark.engine
def test_one_command_against_bia_serve_gives_a_run_whose_report_shows_every_band(tmp_path):
    """Issue 6's "done when": bia serve and bia probe as a user runs them, then bia report of the run."""
    pytest.importorskip("torch")
    import socket

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path / "serve.log"
    server = start_bia("serve", "--port", str(port), "--log-file", str(log))
    try:
        _wait_for(lambda: _healthy(httpx, port), 120)
        (tmp_path / "prompts.txt").write_text("If the argument is\n")
        probe_run = bia("probe", f"http://127.0.0.1:{port}", "-o", str(tmp_path / "run"), "--prompts", str(tmp_path / "prompts.txt"),
                        "--max-tokens", "12", "--server-log", str(log),
                        "--expect", "kernel_mode=batch-invariant")  # the server runs the default mode: a flag that never reached it
    finally:
        server.terminate()
        server.communicate(timeout=30)
    assert probe_run.returncode == 0, probe_run.stderr
    assert "engine: bia serve (GET /v1/models: owned_by 'bia')" in probe_run.stderr
    assert "warning: the server reports kernel_mode='default', not the expected 'batch-invariant'" in probe_run.stderr
    report = bia("report", str(tmp_path / "run"), "-o", str(tmp_path / "report.html"), timeout=600)
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    bands = _table(html, "Bands that part earliest:")  # one prompt: every band is among the worst 20
    assert sorted(b["c"] for b in bands) == ["1", "16", "4", "8"]
    assert all(b["widths formed"].startswith("m=") and b["earliest divergence"] and b["decode tok/s"] not in ("", "—") for b in bands)
    assert next(b for b in bands if b["c"] == "1")["widths formed"].startswith("m=1 x")
    assert max(int(b["m formed"]) for b in bands) >= 4  # the server really batched
    assert [b["c"] for b in _table(html, "Bands per c:")] == ["1", "4", "8", "16"]
    requests = _table(html, "Requests:")
    assert len(requests) == 20 and "9 more of the 29 requests not shown" in html  # the worst 20 of 1 + 4 + 8 + 16
    assert all(r["decode tok/s"] not in ("", "—") and r["length"] for r in requests)
    assert {"divergence at", "reference margin", "own margin", "bit-identical prefix", "max ULP"} <= set(requests[0])
    assert "engine chosen" in html and "engine: bia serve" in html
    assert re.search(r"<td>kernel_mode</td><td><code>batch-invariant</code></td><td class=\"bia-fail\"><code>default</code></td>", html)
    assert re.search(r"<td>layout</td><td><code>copies</code></td><td><code>—</code></td>", html)  # the probe's own choice: not flagged


def _healthy(httpx, port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.engine
def test_a_server_that_dies_mid_run_stops_the_probe_and_resume_finishes_after_a_restart(tmp_path):
    """Server death: the band in flight is refused (reset), the next finds nothing listening and the probe
    stops; once the server is back, --resume --retry-refused fires the unfinished and refused bands again."""
    pytest.importorskip("torch")
    import socket

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url, folder = f"http://127.0.0.1:{port}", tmp_path / "run"
    (tmp_path / "prompts.txt").write_text("If the argument is\n")

    def start_server() -> subprocess.Popen:
        server = start_bia("serve", "--port", str(port), "--mode", "batch-invariant")
        _wait_for(lambda: _healthy(httpx, port), 120)
        return server

    server = start_server()
    child = start_bia("probe", url, "-o", str(folder), "--prompts", str(tmp_path / "prompts.txt"), "--max-tokens", "40", "--top-logprobs", "2",
                 "--declared-min", "8", "--no-metrics")
    try:
        _wait_for(lambda: _in_flight(folder, "band.c4"))  # band c=4 is streaming: the kill cuts it
    finally:
        server.kill()
        server.communicate(timeout=30)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 6 and "the server stopped answering: ConnectError" in stderr and "--resume" in stderr
    stopped = read_run(folder)
    assert stopped.manifest["complete"] is False and "stopped answering" in stopped.manifest["stopped"]["why"]
    assert stopped.manifest["refused"], "the band cut by the server's death is refused, with its reason"
    assert stopped.missing(), "what was never fired is listed"

    server = start_server()
    try:
        resumed = start_bia("probe", url, "-o", str(folder), "--resume", "--retry-refused")
        _, err = resumed.communicate(timeout=180)
    finally:
        server.terminate()
        server.communicate(timeout=30)
    assert resumed.returncode == 0, err
    run = read_run(folder)
    assert run.manifest["complete"] is True and run.missing() == [] and run.manifest["refused"] == []
    assert run.manifest["superseded"] and all("superseded_at" in r for r in run.manifest["superseded"])
    assert [b["result"] for b in to_witness(run, "p0")["bands"]] == ["PASS"] * 4


@pytest.mark.parametrize(
    ("settings_", "message"),
    [({"prompts": []}, "prompts must be one or more"), ({"ladder": (1, 0)}, "the ladder needs"), ({"layout": "zigzag"}, "layout must be"),
     ({"max_tokens": 0}, "max_tokens must be at least 1")],
)
def test_settings_no_run_can_be_made_of_are_refused_before_anything_is_written(tmp_path, settings_, message):
    with HttpServer(routes({})) as server, pytest.raises(ProbeError, match=message):
        asyncio.run(probe(server.url, tmp_path / "run", **{"prompts": ["x"], **settings_}, say=lambda line: None))
    assert not (tmp_path / "run").exists()


def test_a_band_is_released_together(tmp_path):
    """Every capture says when it was sent on the run's clock, and a band's requests are all in flight at once."""
    fake = FakeVllm(tokens=3, hold=0.3)  # each answer takes 0.3 s, so requests sent one after another would never overlap
    with HttpServer(fake.handler) as server:
        folder = asyncio.run(probe(server.url, tmp_path / "run", prompts=["x"], ladder=(8,), max_tokens=3, declared_min=2, metrics=False,
                                   say=lambda line: None))
    rows = [json.loads(line) for line in (folder / "captures" / "requests.jsonl").read_text().splitlines()]
    sent = {(r["role"], r["slot"]): r["sent_at_s"] for r in rows}
    assert sent[("reference", 0)] < sent[("reference", 1)] < min(v for (role, _), v in sent.items() if role == "band")
    band = [v for (role, _), v in sent.items() if role == "band"]
    assert len(band) == 8 and fake.peak == 8  # released together: the server streamed all eight at once
    assert band_table(read_run(folder))["release_skew_s"][0] == pytest.approx(max(band) - min(band))


def test_what_the_server_says_of_itself_becomes_the_runs_effective_settings(tmp_path):
    """An SGLang-like server whose deterministic mode is off while the user expected it on: said, and kept as effective."""
    info = {"model_path": "Qwen/Qwen3-8B", "tp_size": 1, "enable_deterministic_inference": False, "disable_radix_cache": False}
    said = []
    table = {"GET /get_server_info": _json(info), "POST /v1/chat/completions": lambda h: ObserverAffected.answer_stream(h)}
    with HttpServer(routes(table)) as server:
        folder = asyncio.run(probe(server.url, tmp_path / "run", prompts=["x"], ladder=(1,), max_tokens=3, declared_min=2, say=said.append,
                                   expect={"deterministic_inference": True, "batch_invariant": True}))
    manifest = read_run(folder).manifest
    assert manifest["engine"]["profile"] == "sglang" and manifest["server"] == {"info_path": "/get_server_info", "info": info}
    assert manifest["effective"] == {"deterministic_inference": False, "radix_cache_disabled": False, "tp_size": 1}
    assert said[1:] == ["note: the server does not report batch_invariant; the expected True cannot be checked",
                        "warning: the server reports deterministic_inference=False, not the expected True"]


@pytest.mark.engine
def test_the_walkthrough_notebook_probes_bia_serve_in_its_own_kernel(tmp_path):
    """notebooks/03_probe.ipynb executed by papermill, as a user runs it: it starts bia serve, probes it and shows the tables."""
    pytest.importorskip("torch")
    import papermill

    out = tmp_path / "walkthrough.ipynb"
    papermill.execute_notebook(str(ROOT / "notebooks" / "03_probe.ipynb"), str(out), kernel_name="python3", progress_bar=False,
                               parameters={"ladder": [1, 4], "max_tokens": 8, "observer": True, "output": str(tmp_path / "run")}, cwd=str(ROOT))
    import nbformat

    cells = nbformat.read(out, as_version=4).cells
    text = "\n".join(o.get("text", "") + json.dumps(o.get("data", {})) for c in cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "engine: bia serve" in text and f"wrote {tmp_path / 'run'}: 12 requests; missing: 0" in text  # 2 refs, c=1 and c=4 with logprobs, then their 5 observer twins
    assert "image/png" in text and "widths_seen" in text
    run = read_run(tmp_path / "run")
    assert run.manifest["complete"] and observer_table(run).height == 5 and max(band_table(run)["m_formed"]) >= 2


class NeedsKey(Quiet):
    """A server behind a bearer token, as vLLM with --api-key: 401 without it, on every path."""

    protocol_version = "HTTP/1.0"

    def _allowed(self) -> bool:
        if self.headers.get("Authorization") == "Bearer s3cret-key":
            return True
        self.answer(401, b'{"error": "Unauthorized"}')
        return False

    def do_GET(self):
        if self._allowed():
            if self.path == "/v1/models":
                self.answer(200, json.dumps({"data": [{"id": "m", "owned_by": "vllm"}]}).encode())
            else:
                self.answer(404, b"{}")

    def do_POST(self):
        if self._allowed():
            ObserverAffected.answer_stream(self)


def test_a_server_behind_a_key_stops_the_probe_until_it_is_given_and_the_key_is_never_written(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()  # the user's own folder: kept when the probe stops (one the probe created is removed; see test_hostile_network)
    with HttpServer(NeedsKey) as server:
        said = []
        with pytest.raises(ProbeError, match=r"refused the credentials \(give --api-key\): HTTP 401"):
            asyncio.run(probe(server.url, folder, prompts=["x"], ladder=(1, 2), max_tokens=3, declared_min=2, say=said.append))
        assert "GET /v1/models: HTTP 401, the server wants credentials (give --api-key)" in said[0]
        stopped = read_run(folder)
        assert stopped.manifest["done"] == [] and stopped.manifest["refused"] == [] and len(stopped.missing()) == 5
        resumed = bia("probe", server.url, "-o", str(folder), "--resume", env={"BIA_API_KEY": "s3cret-key"})
    assert resumed.returncode == 0, resumed.stderr
    assert "engine: vLLM" in resumed.stderr  # nothing had been fired: detected again, with the key this time
    run = read_run(folder)
    assert run.manifest["complete"] and run.missing() == [] and run.dump.requests.height == 5
    assert not [p for p in folder.rglob("*") if p.is_file() and b"s3cret" in p.read_bytes()]


def test_a_capture_cut_short_by_a_kill_leaves_the_run_readable_and_resume_sets_it_aside(tmp_path):
    """A kill in the middle of appending a capture leaves a last line without its newline: read_run leaves
    that request out and says so, missing() lists it, and --resume fires its band again."""
    folder = tmp_path / "run"
    with HttpServer(ObserverAffected().handler) as server:
        asyncio.run(probe(server.url, folder, prompts=["x"], ladder=(1, 2), max_tokens=3, declared_min=2, say=lambda line: None))
        captures = folder / "captures" / "requests.jsonl"
        lines = captures.read_bytes().splitlines(keepends=True)
        captures.write_bytes(b"".join(lines[:-1]) + lines[-1][:40])  # the last slot of band c=2, cut mid-write
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest.update(complete=False, done=manifest["done"][:-1], m_formed=manifest["m_formed"][:-1])
        (folder / "manifest.json").write_text(json.dumps(manifest))
        stopped = read_run(folder)
        assert [str(e) for e in stopped.dump.skipped] and "cut short" in str(stopped.dump.skipped[0]) and "line 5" in str(stopped.dump.skipped[0])
        assert [(m["c"], m["slot"]) for m in stopped.missing()] == [(2, 1)]
        asyncio.run(probe(server.url, folder, resume=True, say=lambda line: None))
    run = read_run(folder)
    assert run.manifest["complete"] and run.missing() == [] and run.dump.skipped == [] and run.dump.requests.height == 5
    aside = next((folder / "superseded").rglob("requests.jsonl")).read_bytes()
    assert aside.count(b"\n") == 2 and aside.rstrip(b"\n").endswith(lines[-1][:40])  # slot 0 of the band, and the cut line, kept


class BatchSensitive(Quiet):
    """Answers "abcdef" to a request alone and "abcXef" to one whose time overlapped another's: a batch effect on the answer."""

    protocol_version = "HTTP/1.0"
    active: list = []
    lock = threading.Lock()

    def do_GET(self):
        self.answer(404, b"{}")

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        me = {"batched": False}
        with BatchSensitive.lock:
            BatchSensitive.active.append(me)
            if len(BatchSensitive.active) > 1:  # everyone running now shares a batch
                for request in BatchSensitive.active:
                    request["batched"] = True
        time.sleep(0.2)
        with BatchSensitive.lock:
            BatchSensitive.active.remove(me)
        stream_words(self, ["ab", "cX" if me["batched"] else "cd", "ef"])


def test_accuracy_per_configuration_and_std_at_acc_from_a_prompt_set_with_answers(tmp_path, monkeypatch):
    """Two prompts, one answerable: alone the server says "abcdef" (contains "cde"), batched "abcXef".
    Accuracy: m=1 1/2, c=1 1/2, c=2 0/2; Std@Acc = std(0.5, 0.5, 0) = sqrt(1/18) = 0.2357."""
    from analysis.run import accuracy_table

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"text": "x", "answer": "cde"}\n{"text": "y", "answer": "zzz"}\n')
    with HttpServer(BatchSensitive) as server:
        run_ = bia("probe", server.url, "-o", str(tmp_path / "run"), "--prompts", str(prompts), "--ladder", "1,2", "--max-tokens", "3",
                   "--declared-min", "2")
    assert run_.returncode == 0, run_.stderr
    table, std = accuracy_table(read_run(tmp_path / "run"))
    assert table.rows() == [("m=1 reference", 2, 1, 0.5), ("c=1 repeat 0", 2, 1, 0.5), ("c=2 repeat 0", 2, 0, 0.0)]
    assert std == pytest.approx(math.sqrt(1 / 18)) and round(std, 4) == 0.2357
    monkeypatch.setattr("analysis.run._pieces.PIECE_BYTES", 1)  # each prompt a piece: the texts read a piece at a time
    streamed, streamed_std = accuracy_table(read_run(tmp_path / "run", stream=True))
    assert streamed.equals(table) and streamed_std == std
    from analysis.views.html import run_tables_html

    assert "Std@Acc across them = 0.2357" in run_tables_html(read_run(tmp_path / "run"), epsilon=0.05)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\n{"answer": "no text"}\n')
    refused = bia("probe", "http://127.0.0.1:9", "-o", str(tmp_path / "never"), "--prompts", str(bad))
    assert refused.returncode == 2 and f'{bad}: line 2: field "text"' in refused.stderr and not (tmp_path / "never").exists()


class Alternating(Quiet):
    """Answers "ab cd ef" and "ab cX ef" in turn: two m=1 references that part at token 1."""

    protocol_version = "HTTP/1.0"
    calls = 0
    lock = threading.Lock()

    def do_GET(self):
        self.answer(404, b"{}")

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        with Alternating.lock:
            Alternating.calls += 1
            odd = Alternating.calls % 2 == 0
        stream_words(self, ["ab", "cX" if odd else "cd", "ef"])


@pytest.mark.parametrize("anyway", [False, True])
def test_references_that_part_before_declared_min_run_no_band_unless_asked(tmp_path, anyway):
    said = []
    Alternating.calls = 0
    with HttpServer(Alternating) as server:
        folder = asyncio.run(probe(server.url, tmp_path / "run", prompts=["x"], ladder=(1, 2), max_tokens=3, declared_min=2, say=said.append,
                                   bands_anyway=anyway))
    run = read_run(folder)
    assert run.manifest["complete"] and run.missing() == []
    witness = to_witness(run, "p0")
    assert witness["reference"]["self_divergence_at"] == 1 and witness["result"] == "UNMEASURABLE"
    if anyway:
        assert run.dump.requests.height == 2 + 1 + 2 and "skipped" not in run.manifest
    else:
        assert run.dump.requests.height == 2  # the two references only
        assert run.manifest["skipped"] == [{"prompt_id": "p0", "reason": "the two m=1 references diverge at token 1 < declared_min 2; no band is "
                                                                     "run for this prompt (aprender's rule; --bands-anyway runs them)"}]
        assert said[-1].startswith("p0: the two m=1 references diverge at token 1")


def test_a_dry_run_says_what_would_be_sent_and_fires_nothing(tmp_path):
    fake = FakeVllm()
    with HttpServer(fake.handler) as server:
        shown = bia("probe", server.url, "-o", str(tmp_path / "run"), "--dry-run", "--ladder", "1,4", "--prompts",
                    str(_write(tmp_path / "p.txt", "Hello\n")))
    assert shown.returncode == 0, shown.stderr
    assert fake.bodies == [] and not (tmp_path / "run").exists()  # no completion requested, nothing written
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("engine: vLLM (GET /v1/models: owned_by 'vllm')")
    body = json.loads(lines[2].removeprefix("first request body: "))
    assert body["return_tokens_as_token_ids"] is True and body["messages"][0]["content"] == "Hello" and body["model"] == "Qwen/Qwen3-0.6B"
    assert lines[3].startswith("plan: 4 steps, 7 completions: p0/reference/s0, p0/reference/s1, p0/band/c1/r0, p0/band/c4/r0")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_reference_rule_reads_a_reference_kept_before_a_resume(tmp_path):
    """Stopped between the two references: on resume, ref #1 comes from the captures on disk and ref #2 from this session."""
    Alternating.calls = 0
    folder = tmp_path / "run"
    with HttpServer(Alternating) as server:
        asyncio.run(probe(server.url, folder, prompts=["x"], ladder=(1, 2), max_tokens=3, declared_min=2, say=lambda line: None))
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest.update(done=["p0/reference/s0"], complete=False)
        del manifest["skipped"]
        (folder / "manifest.json").write_text(json.dumps(manifest))
        Alternating.calls = 1  # the next answer is the second of the pair: "ab cX ef" against ref #1's "ab cd ef"
        asyncio.run(probe(server.url, folder, resume=True, say=lambda line: None))
    run = read_run(folder)
    assert run.manifest["complete"] and run.dump.requests.height == 2
    assert run.manifest["skipped"][0]["reason"].startswith("the two m=1 references diverge at token 1 < declared_min 2")


@pytest.mark.engine
def test_a_url_naming_another_endpoint_or_tls_to_plain_http_says_what_it_did(tmp_path):
    """Issue 32 item 7: http://host/v1/completions was probed at .../v1/completions/v1/chat/completions (a 404), and https:// to
    a plain-HTTP server said "nothing answers". Now the other endpoint's path is taken off with a note, and a TLS handshake
    that met plain HTTP is named as such (exit 6, with the http:// URL to give)."""
    from analysis.serve import BackgroundServer

    with BackgroundServer("default") as server:
        other = start_bia("probe", f"{server.url}/v1/completions", "--dry-run")
        out, err = other.communicate(timeout=120)
        assert other.returncode == 0, err
        assert err.splitlines()[0] == (f"note: {server.url}/v1/completions names /v1/completions, not the chat endpoint; probing the server "
                                       f"at {server.url} (its /v1/chat/completions): give the base URL to say so")
        assert out.startswith("engine: bia serve")
        tls = start_bia("probe", server.url.replace("http://", "https://"), "--dry-run")
        _, err = tls.communicate(timeout=120)
    assert tls.returncode == 6
    assert err.startswith(f"error: the server at {server.url.replace('http://', 'https://')} answered, but not in TLS (")
    assert err.rstrip().endswith(f"it speaks plain HTTP; give {server.url}")
