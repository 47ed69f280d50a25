"""``bia certify`` end to end on the bundled real runs: its lines, certificate.json, and its exit codes for CI."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from _cli import bia
from conftest import ROOT
from typer.testing import CliRunner

from analysis.cli import app

pytestmark = pytest.mark.slow

DATA = ROOT / "data"


def certify(*args):
    return CliRunner().invoke(app, ["certify", *map(str, args)])


def test_a_real_llamacpp_run_is_red_and_the_exit_code_says_so(tmp_path):
    # the console script itself, as CI runs it: the folder data/llamacpp-cpu holds two runs, both RED in bits only: the one
    # with its prompt cache for run-to-run drift (its ref #2, served from the cache, differs from ref #1), never for c=1
    out = tmp_path / "certificate.json"
    run = bia("certify", str(DATA / "llamacpp-cpu"), "-o", str(out))
    assert run.returncode == 5, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == (f"RED {DATA / 'llamacpp-cpu' / 'cache-prompt'} (copies): not reproducible alone (its prompt cache): 4 of 4 "
                        "requests sent alone part from ref #1 of their prompt, the first p0 ref #2, sent alone: its logprob bits differ "
                        "from ref #1 from token 0 (up to 26 ULP); batching is not judged until the server repeats itself alone")
    assert lines[1] == "  next: turn the cache off: llama-server --no-cache-prompt, then probe again"
    cached, uncached = DATA / "llamacpp-cpu" / "cache-prompt", DATA / "llamacpp-cpu" / "no-cache-prompt"
    assert lines[2] == f"  repro: bia repro {cached} -o {cached}-repro"  # issue 43: a RED run's bug report, a command away
    assert lines[3].startswith(f"RED {uncached} (copies): 56 of 56 batched requests part from m=1")
    assert lines[4] == "  next: batch-invariant kernels: llama-server --parallel 1 (it has no batch-invariant kernels)"
    assert lines[5] == f"  repro: bia repro {uncached} -o {uncached}-repro"
    assert lines[6] == f"wrote {out}: RED, exit 5"
    document = json.loads(out.read_text())
    assert {k: document[k] for k in ("certificate_version", "verdict", "exit_code", "target_rate", "confidence", "requests_needed")} == {
        "certificate_version": 4, "verdict": "RED", "exit_code": 5, "target_rate": 0.01, "confidence": 0.95, "requests_needed": 299}
    assert [(a["arm"], a["verdict"], a["cause"], a["first_request"]["c"], a["first_request"]["parted"]) for a in document["arms"]] == [
        ("copies", "RED", "prompt cache", None, "bits"), ("copies", "RED", "co-batching", 4, "bits")]


def test_amber_green_and_unverified_exit_codes(tmp_path):
    out = tmp_path / "c.json"
    invariant = DATA / "experiment-cpu" / "batch-invariant"
    # bit-identical, every batch formed, 56 batched requests (the 2 at c=1 are no batch): the bound 5.21% is not below 1%
    # (AMBER), but is below 6% (GREEN)
    amber = certify(invariant, "-o", out)
    assert amber.exit_code == 8 and amber.stdout.startswith("AMBER ") and "299 batched requests would do (243 more)" in amber.stdout
    # 0 of 56: 1 - 0.05^(1/56) = 1 - e^(-2.9957323/56) = 1 - e^-0.0534952 = 0.0520895
    assert json.loads(out.read_text())["arms"][0]["upper_bound"] == pytest.approx(0.0520895, abs=1e-7)
    green = certify(invariant, "--target-rate", "0.06", "-o", out, "--force")
    assert green.exit_code == 0 and green.stdout.startswith("GREEN ") and json.loads(out.read_text())["verdict"] == "GREEN"
    # vLLM's CPU build: bit-identical, but some bands never seen formed at their c; the worst verdict sets the exit code
    both = certify(invariant, DATA / "vllm-cpu" / "no-prefix-cache", "-o", out, "--force")
    assert both.exit_code == 7 and [line.split()[0] for line in both.stdout.splitlines()] == ["AMBER", "next:", "UNVERIFIED", "next:", "wrote", "covers:"]


def test_bad_input_is_named_with_bia_s_exit_codes(tmp_path):
    out = tmp_path / "c.json"
    missing = certify(tmp_path / "nothing", "-o", out)
    assert missing.exit_code == 3 and f"error: {tmp_path / 'nothing'}: no such file or directory" in missing.output
    (tmp_path / "empty").mkdir()
    empty = certify(tmp_path / "empty", "-o", out)
    # a folder with nothing to read is exit 3 in every command: bia report and bia witness say so of it too (issue 32, item 5)
    assert empty.exit_code == 3 and "nothing bia certify reads (run directories): the folder holds no file" in empty.output
    not_a_run = certify(ROOT / "README.md", "-o", out)
    assert not_a_run.exit_code == 4 and "README.md: no manifest.json" in not_a_run.output
    assert certify(DATA / "llamacpp-cpu", "--target-rate", "0", "-o", out).exit_code == 2
    assert "--confidence takes a probability in (0, 1), got 1.0" in certify(DATA / "llamacpp-cpu", "--confidence", "1", "-o", out).output
    out.write_text("{}")
    occupied = certify(DATA / "llamacpp-cpu", "-o", out)
    assert occupied.exit_code == 2 and "give --force" in occupied.output and out.read_text() == "{}"
    assert not (tmp_path / "certificate.json").exists()


def test_a_url_is_named_as_a_url_never_read_as_a_path(tmp_path):
    """Issue 22 item 8 (a URL's exit code is not a missing path's): certify took its runs as paths, so a URL read as the path
    http:/127.0.0.1:9/run (one slash gone) that does not exist, exit 3. Since issue 34 an http(s) URL is probed (nothing answers
    at port 9: exit 6, the URL named); any other scheme is a bad option."""
    out = tmp_path / "c.json"
    url = certify("http://127.0.0.1:9/run", "--run", tmp_path / "run", "-o", out, "--wait", "0")
    assert url.exit_code == 6, url.output
    assert "error: nothing answers at http://127.0.0.1:9/run" in url.output
    other = certify("ftp://127.0.0.1:9/run", "-o", out)
    assert other.exit_code == 2 and "error: ftp://127.0.0.1:9/run: bia certify takes one http(s) URL to probe, or run directories" in other.output
    assert not out.exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["serve", "experiment"])
def test_a_command_whose_extra_is_missing_names_it_before_any_work(command, tmp_path):
    """Issue 32, item 2: without torch, bia serve and bia experiment said ModuleNotFoundError in a traceback. Now one line,
    exit 2, naming the extra and how to install it (torch is hidden from the child as if it were not installed)."""
    hide = "import sys; sys.modules['torch'] = None; from analysis.cli import app; app()"
    done = subprocess.run([sys.executable, "-c", hide, command, *(["-o", str(tmp_path / "runs")] if command == "experiment" else [])],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"error: bia {command} needs the torch extra (torch is not installed): pip install -e '.[torch]' in a checkout "
                           "of bia (README says how a GPU user gets a CUDA build of torch instead)\n")
    assert not (tmp_path / "runs").exists()



def test_a_server_that_answers_but_not_as_a_chat_server_is_exit_2_as_cli_md_says(tmp_path):
    """Issue 41: cli.md listed "an HTTP error status" under exit 6 while a 404 exited 2. A server that answers, but not as an
    OpenAI-compatible chat stream (here 404 to every POST), is a URL that is not one to probe: exit 2, said as cli.md says;
    exit 6 is for nothing answering, and README names it."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class NotAChatServer(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"data": [{"id": "m"}]}')

        def do_POST(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotAChatServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        done = bia("certify", url, "--wait", "0", "--ladder", "1,2", "--max-tokens", "4", "-o", "c.json", cwd=tmp_path)
    finally:
        server.shutdown()
    assert done.returncode == 2, done.stderr
    assert "did not answer as an OpenAI-compatible chat stream: HTTP 404" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "c.json").exists() and not any((tmp_path / "runs").glob("*/*"))
    cli = (ROOT / "docs" / "cli.md").read_text()
    assert "a 404 or 501 at the wrong path" in cli and "is exit 2" in cli
    assert "6 when nothing answers at the URL" in (ROOT / "README.md").read_text()
