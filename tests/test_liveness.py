"""A stream's liveness from evidence: servers on loopback that stream live, buffer then burst, or
declare a replay, probed as bia probes; decode rates come from live streams only."""

from __future__ import annotations

import asyncio
import json

import pytest
from loopback import HttpServer, routes, stream_words

from analysis import judge
from analysis.probe import probe
from analysis.run import read_run, slot_table

pytestmark = pytest.mark.slow

WORDS = ["ab", "cd", "ef", "gh", "ij", "kl"]


def answering(**style):
    def answer(handler):
        json.loads(handler.rfile.read(int(handler.headers["Content-Length"])))
        stream_words(handler, WORDS, **style)

    return routes({"POST /v1/chat/completions": answer})


@pytest.mark.parametrize(("style", "liveness", "live"), [
    ({"pause": 0.03}, "observed live", True),  # a token every 30 ms, each chunk read as it comes
    ({"together": 0.2}, "observed burst", False),  # 200 ms of silence, then the whole answer in one write
    ({"pause": 0.03, "stream_mode": "replay"}, "declared replay", False),  # paced, but the server says it replays a buffer
    ({"pause": 0.03, "stream_mode": "live"}, "declared live", True),
    # issue 32 item 9: says live, but the whole answer comes in one write (as a buffer on the way does): no rate, no cost
    ({"together": 0.2, "stream_mode": "live"}, "observed rush", False),
])
def test_liveness_is_judged_per_request_from_what_arrived(tmp_path, style, liveness, live):
    with HttpServer(answering(**style)) as server:
        folder = asyncio.run(probe(server.url, tmp_path / "run", prompts=["x"], ladder=(1, 2), max_tokens=len(WORDS), declared_min=2))
    run = read_run(folder)
    requests = run.requests
    assert requests.height == 5 and requests["liveness"].to_list() == [liveness] * 5
    assert requests["stream_live"].to_list() == [live] * 5
    rates = slot_table(run)["decode_tok_s"]
    if live:  # five gaps of at least 30 ms between six tokens: never faster than 1 / 0.03 tokens/s, as the server paced them
        assert rates.null_count() == 0 and (rates <= 1 / 0.03 * 1.01).all() and (rates > 0).all()
    else:
        assert rates.null_count() == rates.len()
        assert judge(run).to_dicts()[0]["cost_by_c"] == []  # a band's cost is never computed from a burst
