"""bia serve on loopback: continuous batching, the per-step log, and the kernel modes' bits."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import struct
import threading
import time

import httpx
import pytest
from _cli import bia, start_bia

torch = pytest.importorskip("torch")
uvicorn = pytest.importorskip("uvicorn")

from analysis.dumps._read import parse_source
from analysis.serve import BackgroundServer as Server

pytestmark = pytest.mark.engine

BODY = {"messages": [{"role": "user", "content": "If the argument is"}], "max_tokens": 8, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 3}


@pytest.fixture
def batch_log(caplog):
    caplog.set_level(logging.INFO, logger="bia.serve")
    return caplog


async def _fire(url: str, c: int) -> list[str]:
    async with httpx.AsyncClient(timeout=60) as client:
        async def one() -> str:
            async with client.stream("POST", f"{url}/v1/chat/completions", json=BODY) as response:
                assert response.status_code == 200
                return (await response.aread()).decode()
        return await asyncio.gather(*(one() for _ in range(c)))


def _bits(sse: str) -> list[tuple[int, float]]:
    rows, _ = parse_source(sse.encode(), "capture.sse")
    tokens, _, requests = rows.frames()
    assert requests["stream_live"].to_list() == [True] and requests["completion_tokens"].to_list() == [8]
    return list(zip(tokens["token_id"].to_list(), tokens["raw_value"].to_list()))


@pytest.mark.parametrize("mode", ["default", "one-by-one", "fixed-tiles", "row-invariant"])
def test_batched_streams_against_a_request_alone(mode, batch_log):
    server = Server(mode)
    try:
        alone = _bits(asyncio.run(_fire(server.url, 1))[0])
        batch_log.clear()
        together = [_bits(s) for s in asyncio.run(_fire(server.url, 4))]
        widths = [int(r.getMessage().split("m=")[1].split()[0]) for r in batch_log.records if "Batch m=" in r.getMessage()]
    finally:
        server.stop()
    assert max(widths) >= 2, "continuous batching never put two requests in one step"
    assert all([t for t, _ in s] == [t for t, _ in alone] for s in together)  # no token flips for this prompt
    if mode != "default":
        assert all(s == alone for s in together)
    elif max(widths) == 4:
        assert any(s != alone for s in together), "the default mode's batched bits were expected to differ"


async def _fire_mixed(url: str, bodies: list[dict], stagger: float) -> list[list[tuple[int, float]]]:
    """Each body as a streamed request, the next sent ``stagger`` seconds after the one before; every stream's (token, logprob)."""
    async with httpx.AsyncClient(timeout=60) as client:
        async def one(k: int, body: dict) -> list[tuple[int, float]]:
            await asyncio.sleep(k * stagger)
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                rows, _ = parse_source(await response.aread(), "capture.sse")
            tokens = rows.frames()[0]
            return list(zip(tokens["token_id"].to_list(), tokens["raw_value"].to_list()))
        return await asyncio.gather(*(one(k, b) for k, b in enumerate(bodies)))


@pytest.mark.parametrize("mode", ["fixed-tiles", "row-invariant"])
def test_packed_modes_keep_each_requests_bits_as_requests_join_and_leave(batch_log, mode):
    """Prompts of mixed lengths and completions, arriving while others decode and leaving at other steps: the
    engine's cache is regrouped at every change, and each stream stays bit-identical to the same request alone."""
    prompts = ["Raise", "If the argument is", "Return a new list of the values in the order given", "This function returns"]
    bodies = [{**BODY, "messages": [{"role": "user", "content": p}], "max_tokens": 6 + 5 * k} for k, p in enumerate(prompts * 2)]
    with Server(mode) as server:
        alone = [asyncio.run(_fire_mixed(server.url, [body], 0))[0] for body in bodies]
        batch_log.clear()
        together = asyncio.run(_fire_mixed(server.url, bodies, 0.01))
    widths = [int(r.getMessage().split("m=")[1].split()[0]) for r in batch_log.records if "Batch m=" in r.getMessage()]
    assert len(set(widths)) >= 3, f"the batch never changed much: widths {sorted(set(widths))}"
    assert together == alone


def test_the_old_mode_name_serves_one_by_one():
    with Server("batch-invariant") as server:
        assert httpx.get(f"{server.url}/health", timeout=30).json()["kernel_mode"] == "one-by-one"


def test_bad_requests_are_refused():
    server = Server("default")
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.post("/v1/chat/completions", json={**BODY, "temperature": 0.7}).status_code == 400
            assert client.post("/v1/chat/completions", content=b"{not json").status_code == 400
            plain = client.post("/v1/chat/completions", json={**BODY, "stream": False})
            assert plain.status_code == 200 and len(plain.json()["choices"][0]["logprobs"]["content"]) == 8
            assert "bia:num_requests_running 0.0" in client.get("/metrics").text
    finally:
        server.stop()


@pytest.mark.parametrize("mode", ["default", "one-by-one", "fixed-tiles"])
def test_probe_against_bia_serve_writes_a_run(tmp_path, mode):
    """The probe on loopback: widths from the server's log, live rates, the kernel mode's bits, and a witness shape-check reads."""
    import polars as pl

    from analysis.probe import probe
    from analysis.run import read_run, slot_table, to_witness

    log = tmp_path / "serve.log"
    with Server(mode, log_file=log) as server:
        folder = asyncio.run(probe(server.url, tmp_path / "run", prompts=["If the argument is"], ladder=(1, 2, 4), max_tokens=12,
                                   top_logprobs=3, server_log=log, declared_min=4))
    run = read_run(folder)
    assert run.manifest["complete"] and run.manifest["refused"] == []
    widths = {entry["c"]: entry["widths"] for entry in run.manifest["m_formed"]}
    assert max(widths[1]) == 1 and max(widths[4]) >= 2 and len(widths[4]) >= 12  # every step's width is kept
    table = slot_table(run)
    assert table.height == 1 + 2 + 4 and table["divergence_at"].null_count() == table.height and (table["length"] == 12).all()  # no token flips for this prompt in either mode
    batched = table.filter(pl.col("c") == 4)["bitwise_prefix"]
    if mode != "default":
        assert (table["bitwise_prefix"] == 12).all()
    else:  # the server formed m >= 2 (asserted above): batched rows' float32 logprobs part from m=1's
        assert (batched < 12).any(), f"bitwise prefixes at c=4: {batched.to_list()}"
        assert (table.filter(pl.col("c") == 1)["bitwise_prefix"] == 12).all()
    assert table["decode_tok_s"].null_count() == 0  # live streams with arrival times give every request a rate
    witness = to_witness(run, "p0")
    assert [b["c"] for b in witness["bands"]] == [1, 2, 4] and witness["bands"][0]["result"] == "PASS"


def test_bia_serve_times_each_request_and_short_streams_get_its_rate_never_a_bursts(tmp_path):
    """Issue 32 item 9: 16-token streams from bia serve reached the client in one burst (a c=1 stream "decoded" at 36,453 tok/s)
    and the cost read "c=4 0.00x". bia serve now times each request as llama.cpp does (``timings`` in the last chunk and in a
    whole response), and every rate is the server's: the cost compares like with like, whatever the streams' arrival showed."""
    import httpx
    import polars as pl

    from analysis import judge
    from analysis.probe import probe
    from analysis.run import read_run, slot_table

    with Server("default") as server:
        body = {"model": "m", "messages": [{"role": "user", "content": "If the"}], "max_tokens": 5}
        whole = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30).json()
        folder = asyncio.run(probe(server.url, tmp_path / "run", prompts=["If the argument is"], ladder=(1, 4), max_tokens=16, repeats=3,
                                   declared_min=4))
    assert whole["timings"]["predicted_n"] == 5 and whole["timings"]["prompt_n"] == whole["usage"]["prompt_tokens"]
    assert whole["timings"]["predicted_per_second"] == pytest.approx(5 / whole["timings"]["predicted_ms"] * 1000, rel=1e-3)
    table = slot_table(read_run(folder))
    assert table["decode_rate_origin"].unique().to_list() == ["server: timings, request"]
    assert table["decode_tok_s"].null_count() == 0 and table["decode_tok_s"].max() < 20_000  # no burst's 36,453 tok/s
    cost = judge(read_run(folder)).to_dicts()[0]["cost_by_c"]
    assert [(c["c"], c["origin"], c["base_rates"]) for c in cost] == [(4, "server", 3)]
    assert 0.05 < cost[0]["ratio"] < 5  # c=4 shares each step among 4 rows: slower per request, never 0.00x
    ones = table.filter(pl.col("c") == 1)["decode_tok_s"]
    assert cost[0]["base_median"] == pytest.approx(ones.median())


def test_probe_lists_refusals_and_the_run_says_unmeasurable(tmp_path):
    """A real loopback server that answers 501 (no logprobs): the first request is refused in the server's own words,
    the probe stops there (no run of refusals claims to be complete), and the run in the user's folder says unmeasurable."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from analysis.probe import ProbeError, probe
    from analysis.run import read_run, to_witness

    class NoLogprobs(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = b'{"error": {"message": "logprobs are not supported"}}'
            self.send_response(501)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), NoLogprobs)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    folder = tmp_path / "run"
    folder.mkdir()  # the user's own folder: kept when the probe stops
    reason = 'HTTP 501 Not Implemented: {"error": {"message": "logprobs are not supported"}}'
    try:
        with pytest.raises(ProbeError, match=re.escape(f"did not answer as an OpenAI-compatible chat stream: {reason}; what came back: HTTP 501")):
            asyncio.run(probe(f"http://127.0.0.1:{httpd.server_address[1]}", folder, prompts=["x"], ladder=(1, 2), max_tokens=4))
    finally:
        httpd.shutdown()
        httpd.server_close()
    manifest = read_run(folder).manifest
    assert [r["reason"] for r in manifest["refused"]] == [reason]
    assert manifest["complete"] is False
    witness = to_witness(read_run(folder), "p0")
    assert witness["reference"]["stable"] is False and witness["result"] == "UNMEASURABLE"


def test_the_report_lists_what_a_run_lacks(tmp_path):
    from analysis.views.html import run_html
    from analysis.run import read_run

    folder = tmp_path / "run"
    (folder / "captures").mkdir(parents=True)
    (folder / "captures" / "requests.jsonl").write_text("")
    manifest = {"run_version": 1, "ladder": [1], "prompts": [{"prompt_id": "p0", "text": "x"}], "complete": False,
                "refused": [{"prompt_id": "p0", "role": "reference", "slot": 0, "reason": "HTTP 500: <b>boom</b>"}]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    html = run_html(read_run(folder))
    assert "The run did not finish" in html
    assert "2 request(s) never came back" in html and "1 request(s) refused" in html
    assert "&lt;b&gt;boom&lt;/b&gt;" in html and "<b>boom</b>" not in html


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [("cut", "the stream was cut mid-event"), ("no-done", "the stream ended without [DONE]"), ("error-event", "the server sent an error event"),
     ("stall", "the request ran past its 1 s deadline"), ("500", "HTTP 500"), ("malformed", "the stream does not parse"), ("reset", "ReadError")],
)
def test_probe_refuses_broken_streams_and_keeps_their_bytes(tmp_path, behaviour, reason):
    """Real loopback servers that misbehave on purpose after a first whole answer (the probe's server check): each later
    slot is refused with its reason, the run stays readable."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from analysis.probe import probe
    from analysis.run import read_run

    chunk = 'data: {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "a"}, "logprobs": null}]}\n\n'
    whole = ('data: {"choices": [{"index": 0, "delta": {"content": "a"}, "logprobs": {"content": [{"token": "a", "logprob": -0.1, '
             '"top_logprobs": [{"token": "a", "logprob": -0.1}]}]}}]}\n\ndata: [DONE]\n\n')
    calls = []

    class Broken(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            calls.append(1)
            if len(calls) == 1:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self.wfile.write(whole.encode())
                return
            if behaviour == "500":
                self.send_response(500)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            if behaviour == "stall":
                time.sleep(3)
                return
            if behaviour == "reset":  # a TCP reset mid-stream: linger 0 makes close() send RST instead of FIN
                self.wfile.write(chunk.encode())
                self.wfile.flush()
                time.sleep(0.05)
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                return
            body = {"cut": chunk + 'data: {"id": "x", "obj', "no-done": chunk, "error-event": chunk + 'data: {"error": {"message": "CUDA OOM"}}\n\n',
                    "malformed": chunk + "data: {not json}\n\n" + chunk + "data: [DONE]\n\n"}[behaviour]
            self.wfile.write(body.encode())

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        folder = asyncio.run(probe(f"http://127.0.0.1:{httpd.server_address[1]}", tmp_path / "run", prompts=["x"], ladder=(1,), max_tokens=4,
                                   timeout=1.0))
    finally:
        httpd.shutdown()
        httpd.server_close()
    run = read_run(folder)
    assert len(run.manifest["refused"]) == 2 and all(r["reason"].startswith(reason) for r in run.manifest["refused"])
    assert run.dump.requests.height == 1  # the first reference
    if behaviour in ("cut", "no-done", "error-event", "malformed", "reset"):
        kept = [json.loads(line) for line in (folder / "refused.jsonl").read_text().splitlines()]
        assert len(kept) == 2 and all(k["sse"].startswith("data: ") for k in kept)


def test_bia_probe_command_line(tmp_path):
    server = Server("default")
    try:
        run = bia("probe", server.url, "-o", str(tmp_path / "run"), "--ladder", "1,2", "--max-tokens", "4", "--top-logprobs", "2", timeout=120)
    finally:
        server.stop()
    assert run.returncode == 0, run.stderr
    wrote, found = run.stdout.splitlines()
    assert wrote == f"wrote {tmp_path / 'run'}"
    assert "probe" not in run.stderr  # no progress bar when stderr is not a terminal
    from analysis.run import read_run, slot_table

    written = read_run(tmp_path / "run")
    assert written.dump.requests.height == 2 * (2 + 1 + 2)  # two default prompts: two references, then c = 1 and 2
    # the last line says what the run found, per c, from the run's own tables (two requests at c=1, four at c=2)
    counts = dict(slot_table(written).group_by("c").len().rows())
    assert counts == {1: 2, 2: 4}
    # it begins with the run's judgement (analysis.judge), as bia certify and the report's answer give it, then its next step
    from analysis import judge

    assert found.startswith(f"{judge(written).verdict} ")
    assert re.fullmatch(r"(GREEN|AMBER|RED|UNVERIFIED)( \([\w -]+\))?: .*\. Next: .*\. c=1: bits \d+% \(\d of 2\), tokens \d+% \(\d of 2\); "
                        r"c=2: bits \d+% \(\d of 4\), tokens \d+% \(\d of 4\)", found), found


def test_bia_serve_says_where_it_listens_once_it_does():
    """Issue 22: bia serve printed nothing at start-up. One line, once listening, with the address (the port bound, here a free one)
    and the mode; an address it cannot listen on is an error, exit 2."""
    server = start_bia("serve", "--port", "0", "--mode", "fixed-tiles")
    try:
        line = server.stdout.readline()  # blocks until the line comes: the server is listening by then
        found = re.fullmatch(r"bia serve: listening on (http://127\.0\.0\.1:(\d+)) \(kernel mode fixed-tiles, float32 on cpu, model tiny_lm\); "
                             r"Ctrl-C stops it\n", line)
        assert found, line
        assert httpx.get(f"{found[1]}/health", timeout=10).json()["kernel_mode"] == "fixed-tiles"
        with socket.socket() as taken:  # a port in use: the second server says it cannot listen there
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            busy = bia("serve", "--port", str(port), timeout=120)
    finally:
        server.terminate()
        server.communicate(timeout=30)
    assert busy.returncode == 2 and busy.stdout == ""
    assert f"error: --host 127.0.0.1 --port {port}: cannot listen there" in busy.stderr


@pytest.mark.parametrize("verbose", [False, True])
def test_bia_serve_says_a_line_per_request_and_each_step_only_with_v(tmp_path, verbose):
    """Issue 32 item 8: bia serve wrote every decode step to stderr (3,915 lines for a few small probes). Now the terminal gets
    one line per request, each step only with -v; --log-file keeps every step, as bia probe --server-log reads them."""
    log = tmp_path / "serve.log"
    server = start_bia("serve", "--port", "0", "--log-file", str(log), *(["-v"] if verbose else []))
    try:
        url = re.search(r"http://\S+", server.stdout.readline())[0]
        for stream in (False, True):
            with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=30, json={
                    "messages": [{"role": "user", "content": "If the argument is"}], "max_tokens": 6, "stream": stream}) as response:
                assert response.status_code == 200 and response.read()
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    lines = err.splitlines()
    requests = [line for line in lines if re.fullmatch(r"chatcmpl-\w+: \d+ prompt and 6 completion tokens in [\d.]+ s( \(streamed\))?", line)]
    steps = [line for line in lines if "Batch m=" in line]
    assert len(requests) == 2 and requests[1].endswith("(streamed)")
    assert (len(steps) >= 12) if verbose else (steps == [] and len(lines) == 2)
    assert sum("Batch m=" in line for line in log.read_text().splitlines()) >= 12  # the log file keeps every step either way
