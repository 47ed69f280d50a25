"""The CI recipe (issue 34 item 3): the Certify step of docs/examples/batch-invariance.yml, its shell commands run as written
with its env pointed at a real server on loopback, bia serve and llama.cpp's llama-server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

pytestmark = pytest.mark.engine

RECIPE = ROOT / "docs" / "examples" / "batch-invariance.yml"


def _certify_step() -> dict:
    steps = yaml.safe_load(RECIPE.read_text())["jobs"]["certify"]["steps"]
    return next(step for step in steps if step.get("name") == "Certify")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_recipe(tmp_path: Path, server: str, url: str) -> tuple[subprocess.CompletedProcess, dict]:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("If the argument is\n")
    step = _certify_step()
    env = {**os.environ, **step["env"], "SERVER": server, "URL": url, "OUT": str(tmp_path / "out"),
           "CERTIFY_OPTIONS": f"--ladder 1,2,4 --max-tokens 8 --prompts {prompts}",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # bia as the job's pip install puts it
    done = subprocess.run(["bash", "-c", step["run"]], capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    certificate = tmp_path / "out" / "certificate.json"
    return done, json.loads(certificate.read_text()) if certificate.exists() else {}


def test_the_recipe_names_the_certificate_and_the_run_it_keeps():
    step = _certify_step()
    assert set(step["env"]) == {"SERVER", "URL", "OUT"} and "bia certify \"$URL\"" in step["run"]
    kept = next(s for s in yaml.safe_load(RECIPE.read_text())["jobs"]["certify"]["steps"] if s.get("uses", "").startswith("actions/upload"))
    assert kept["with"]["path"] == "bia-certify/" == step["env"]["OUT"] + "/"


def test_the_recipe_fails_the_job_on_bia_serve_in_its_default_kernels(tmp_path):
    port = _free_port()
    done, certificate = _run_recipe(tmp_path, f"{sys.executable} -m analysis serve --port {port} --mode default -v", f"http://127.0.0.1:{port}")
    assert done.returncode == 5, done.stdout + done.stderr
    assert certificate["verdict"] == "RED" and certificate["probe"]["stopped"] == "RED"
    assert done.stdout.splitlines()[0].startswith(f"RED {tmp_path / 'out' / 'run'} (copies): ")


def test_the_recipe_fails_the_job_on_llama_server(tmp_path, server_binary):
    from analysis.experiment import bundled_model
    from analysis.experiment.engines import MODEL_ALIAS, write_gguf

    pytest.importorskip("gguf")
    model = write_gguf(bundled_model(), tmp_path / "tiny.gguf")
    port = _free_port()
    server = (f"{server_binary} -m {model} --alias {MODEL_ALIAS} --host 127.0.0.1 --port {port} -np 4 -c 4096 --metrics --no-webui "
              "--no-cache-prompt -t 1")
    done, certificate = _run_recipe(tmp_path, server, f"http://127.0.0.1:{port}")
    assert done.returncode == 5, done.stdout + done.stderr  # llama.cpp has no batch-invariant kernels: a batched request parts
    arm = certificate["arms"][0]
    assert arm["engine"] == "llama.cpp server" and arm["verdict"] == "RED" and arm["next_step"].startswith("batch-invariant kernels: llama-server")
