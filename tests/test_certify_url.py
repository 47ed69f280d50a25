"""bia certify URL (issue 34 item 3): a live server probed with the requests the bound needs, stopped once the verdict is known,
certified; against bia serve on loopback (a real server: continuous batching, its own kernels)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time

import pytest
from _cli import BIA, ROOT, bia, start_bia

from analysis.probe import ProbeError, planned_repeats
from analysis.run import read_run
from analysis.serve import BackgroundServer

pytestmark = pytest.mark.engine


def _certify(url, tmp_path, *options, log=None):
    return bia("certify", url, "--run", str(tmp_path / "run"), "-o", str(tmp_path / "c.json"), "--prompts", str(_prompts(tmp_path)),
               *(["--server-log", str(log)] if log else []), *options, timeout=600)


def _prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("If the argument is\n")
    return path


def test_the_default_mode_ends_red_at_the_first_batched_request_that_parts_long_before_the_plan_ends(tmp_path):
    with BackgroundServer("default", log_file=tmp_path / "serve.log") as server:
        done = _certify(server.url, tmp_path, "--ladder", "1,2,4", "--max-tokens", "8", log=tmp_path / "serve.log")
    assert done.returncode == 5, done.stderr
    document = json.loads((tmp_path / "c.json").read_text())
    arm = document["arms"][0]
    assert document["verdict"] == "RED" and document["probe"]["stopped"] == "RED"
    assert (document["probe"]["planned_batched_requests"], document["probe"]["planned_contexts"]) == (450, 300)
    assert arm["cause"] == "co-batching" and 0 < arm["requests"] < 100 and arm["missing"] > 200  # stopped within a few polls
    assert "stopped early: a request parted, so the verdict is RED whatever follows" in done.stderr
    assert done.stdout.splitlines()[0].startswith(f"RED {tmp_path / 'run'} (copies): ")
    # the plan: a repeat sends 2 + 4 batched requests, 1 + 3 of them in a new context (c - 1 copies and a companion); 299 needed
    assert read_run(tmp_path / "run").manifest["repeats"] == 75


def test_row_invariant_ends_green_at_one_percent_with_the_fewest_requests_the_bound_allows(tmp_path):
    with BackgroundServer("row-invariant", log_file=tmp_path / "serve.log") as server:
        # 64 tokens: long enough that a band's 4 requests are in the batch together on a busy machine (with 4 or 16, one may finish
        # before the last joins: never seen formed at its c, and the verdict honestly UNVERIFIED)
        done = _certify(server.url, tmp_path, "--ladder", "1,2,4", "--max-tokens", "64", log=tmp_path / "serve.log")
    assert done.returncode == 0, done.stdout + done.stderr
    arm = json.loads((tmp_path / "c.json").read_text())["arms"][0]
    # 299 bit-identical batched requests bound the rate below 1% at 95%; a repeat records 1 + 3 = 4 (each in a context of its
    # own: the companion moves), so 75 repeats: 300
    assert (arm["verdict"], arm["requests"], arm["divergent"], arm["missing"], arm["bands_unformed"]) == ("GREEN", 300, 0, 0, 0)
    assert arm["upper_bound"] < 0.01


def test_max_requests_caps_the_plan_and_the_verdict_says_amber(tmp_path):
    with BackgroundServer("fixed-tiles", log_file=tmp_path / "serve.log") as server:
        done = _certify(server.url, tmp_path, "--ladder", "1,2,4", "--max-tokens", "64", "--max-requests", "20", log=tmp_path / "serve.log")
    assert done.returncode == 8, done.stdout + done.stderr
    arm = json.loads((tmp_path / "c.json").read_text())["arms"][0]
    assert (arm["verdict"], arm["requests"]) == ("AMBER", 12)  # 3 whole repeats of 6 sent fit in 20: 3 x 4 recorded


def test_max_time_stops_the_probe_and_judges_what_came_back(tmp_path):
    with BackgroundServer("fixed-tiles", log_file=tmp_path / "serve.log") as server:
        done = _certify(server.url, tmp_path, "--ladder", "1,2,4", "--max-tokens", "32", "--max-time", "3", log=tmp_path / "serve.log")
    document = json.loads((tmp_path / "c.json").read_text())
    assert document["probe"]["stopped"] == "max-time" and "stopped early: --max-time 3 s ran out" in done.stderr
    assert document["arms"][0]["missing"] > 0 and done.returncode in (7, 8)  # unfinished: UNVERIFIED (missing), never GREEN


@pytest.mark.parametrize("options, code, words", [
    (["--max-requests", "5"], 2, "error: --max-requests 5: one round of the ladder sends 6 batched requests; give at least that"),
    (["--ladder", "1"], 2, "error: --ladder 1: a certificate needs a batch size above 1"),
    (["--max-time", "0"], 2, "error: --max-time takes a positive number of seconds, got 0.0"),
])
def test_plans_that_cannot_certify_are_refused_before_any_request(tmp_path, options, code, words):
    done = _certify("http://127.0.0.1:9", tmp_path, "--ladder", "1,2,4", *options)  # nothing listens on port 9: never asked
    assert done.returncode == code and done.stderr.strip().splitlines()[-1] == words
    assert not (tmp_path / "run").exists() and not (tmp_path / "c.json").exists()


def test_a_url_nothing_answers_at_is_exit_6_after_the_wait_it_says(tmp_path):
    """Issue 41: README's paste starts bia serve and certifies it at once; certify waits for a server that is starting, says so
    on one line, and gives up with exit 6 after --wait seconds."""
    started = time.monotonic()
    done = _certify("http://127.0.0.1:9", tmp_path, "--ladder", "1,2,4", "--wait", "2")
    assert time.monotonic() - started >= 2
    assert done.returncode == 6 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "waiting up to 2 s for http://127.0.0.1:9 to answer (--wait)"
    assert lines[-1].startswith("error: nothing answers at http://127.0.0.1:9 after 2 s (ConnectError: ")
    assert "--wait SECONDS waits longer" in lines[-1] and not (tmp_path / "run").exists()
    at_once = _certify("http://127.0.0.1:9", tmp_path, "--ladder", "1,2,4", "--wait", "0")
    assert at_once.returncode == 6 and "waiting" not in at_once.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_certify_waits_for_a_server_that_starts_after_it(tmp_path):
    """bia serve started two seconds after certify: certify waits (one line), then certifies it as if it had been up."""
    port = _free_port()
    certify = start_bia("certify", f"http://127.0.0.1:{port}", "--run", tmp_path / "run", "-o", tmp_path / "c.json",
                        "--prompts", _prompts(tmp_path), "--ladder", "1,2", "--max-tokens", "8", "--max-requests", "8", cwd=tmp_path)
    time.sleep(2)
    server = subprocess.Popen([*BIA, "serve", "--port", str(port), "--mode", "row-invariant"], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # its log lines unread would fill a pipe
    try:
        out, err = certify.communicate(timeout=600)
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert certify.returncode in (0, 8), out + err  # every request bit-identical; the bound is not the point here
    assert err.splitlines()[0] == f"waiting up to 1 min for http://127.0.0.1:{port} to answer (--wait)"
    assert json.loads((tmp_path / "c.json").read_text())["arms"][0]["divergent"] == 0


def test_certifying_again_in_the_same_folder_keeps_each_run_and_replaces_the_certificate(tmp_path):
    """Issue 41: the same command twice exited 2 (certificate.json exists), and with --force 2 again ("--run already exists;
    give --force to overwrite it", the advice it had just ignored). Each certification now probes into a run folder of its
    own and replaces the certificate it wrote; --run DIR is replaced with --force when it holds a run, refused otherwise."""
    options = ("--prompts", _prompts(tmp_path), "--ladder", "1,2", "--max-tokens", "8")
    with BackgroundServer("default") as server:
        first = bia("certify", server.url, "-o", "certificate.json", *options, cwd=tmp_path, timeout=600)
        second = bia("certify", server.url, "-o", "certificate.json", *options, cwd=tmp_path, timeout=600)
        assert (first.returncode, second.returncode) == (5, 5), first.stderr + second.stderr
        runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
        assert len(runs) == 2 and all(re.fullmatch(r"certify-\d{8}-\d{6}(-\d+)?", name) for name in runs)
        assert json.loads((tmp_path / "certificate.json").read_text())["probe"]["run"] in {f"runs/{name}" for name in runs}
        again = bia("certify", server.url, "--run", f"runs/{runs[0]}", "-o", "certificate.json", *options, cwd=tmp_path)
        assert again.returncode == 2 and "give --force to overwrite it" in again.stderr
        forced = bia("certify", server.url, "--run", f"runs/{runs[0]}", "-o", "certificate.json", "--force", *options,
                     cwd=tmp_path, timeout=600)
        assert forced.returncode == 5, forced.stderr  # the advice the refusal gave works
        (tmp_path / "notes").mkdir()
        (tmp_path / "notes" / "todo.txt").write_text("mine")
        other = bia("certify", server.url, "--run", "notes", "-o", "certificate.json", "--force", *options, cwd=tmp_path)
        assert other.returncode == 2 and "not a run" in other.stderr and "--force" not in other.stderr
        assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"
    (tmp_path / "mine.json").write_text('{"not": "a certificate"}')
    refused = bia("certify", "data/experiment-cpu/default", "-o", tmp_path / "mine.json", cwd=ROOT)
    assert refused.returncode == 2 and "--force" in refused.stderr
    assert json.loads((tmp_path / "mine.json").read_text()) == {"not": "a certificate"}


def test_a_url_beside_run_directories_is_refused(tmp_path):
    done = bia("certify", "http://127.0.0.1:9", "data/experiment-cpu/default", "-o", str(tmp_path / "c.json"))
    assert done.returncode == 2 and "takes one http(s) URL to probe, or run directories, not both" in done.stderr


def test_the_plan_is_the_fewest_repeats_that_reach_the_bound():
    assert planned_repeats(target_rate=0.01, confidence=0.95, ladder=[1, 4, 8, 16], prompts=2) == 6  # 50 contexts a repeat: 5 give 250
    assert planned_repeats(target_rate=0.05, confidence=0.95, ladder=[1, 4, 8, 16], prompts=2) == 2  # 59 needed: 2 repeats, 100
    with pytest.raises(ProbeError):
        planned_repeats(target_rate=0.01, confidence=0.95, ladder=[1], prompts=2)
