"""The CI recipe (issue 34 item 3, issue 41): the workflow shown in docs/ci.md, read from the page as GitHub renders it. Its
Install step runs as written; its Certify step's shell commands run as written, from a folder whose ``.venv`` is this
suite's (the checkout's), as they stand (bia serve, row-invariant: GREEN) and with ``SERVER`` pointed at bia serve's
default kernels and at llama.cpp's llama-server on loopback (RED)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

pytestmark = pytest.mark.engine

CI_PAGE = ROOT / "docs" / "ci.md"


def _workflow() -> dict:
    """The one YAML block of docs/ci.md, parsed."""
    (block,) = re.findall(r"^```yaml\n(.*?)^```", CI_PAGE.read_text(), flags=re.M | re.S)
    return yaml.safe_load(block)


def _step(name: str) -> dict:
    return next(step for step in _workflow()["jobs"]["certify"]["steps"] if step.get("name") == name)


def _certify_step() -> dict:
    return _step("Certify")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_recipe(tmp_path: Path, server: str | None = None, url: str | None = None, options: str | None = None,
                ) -> tuple[subprocess.CompletedProcess, dict]:
    """The Certify step's commands run by bash from ``tmp_path`` (its ``.venv`` this suite's), ``SERVER``, ``URL`` and
    ``CERTIFY_OPTIONS`` over the step's own env when given."""
    step = _certify_step()
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1], target_is_directory=True)
    env = {**{k: v for k, v in os.environ.items() if k != "CERTIFY_OPTIONS"}, **step["env"]}
    env.update({name: value for name, value in (("SERVER", server), ("URL", url), ("CERTIFY_OPTIONS", options)) if value})
    done = subprocess.run(["bash", "-c", step["run"]], capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    certificate = tmp_path / step["env"]["OUT"] / "certificate.json"
    return done, json.loads(certificate.read_text()) if certificate.exists() else {}


def _small(tmp_path: Path) -> str:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("If the argument is\n")
    return f"--ladder 1,2,4 --max-tokens 8 --prompts {prompts}"


def test_the_workflow_installs_bia_from_this_repository_with_no_placeholder():
    """docs/ci.md once installed from git+https://github.com/YOUR-ORG/bia and called a bare bia (exit 127 after README's
    install): now README's set-up, and bia from the checkout's .venv, in every command of the page."""
    text = CI_PAGE.read_text()
    assert "YOUR-ORG" not in text and "{literalinclude}" not in text
    install = _step("Install bia")["run"]
    assert install.split("#")[0].split() == ["BIA_EXTRAS=torch", "bash", "scripts/setup.sh"]
    done = subprocess.run(["bash", "-c", install], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr
    commands = re.findall(r"^\s*(?:\$ )?(\S*bia) (?:certify|serve)", "\n".join(re.findall(r"^```(?:bash|yaml)\n(.*?)^```", text,
                                                                                           flags=re.M | re.S)), flags=re.M)
    step = _certify_step()
    assert commands and set(commands) == {".venv/bin/bia"} and step["env"]["SERVER"].startswith(".venv/bin/bia serve")


def test_the_recipe_as_written_certifies_bia_serve_row_invariant_green(tmp_path):
    done, certificate = _run_recipe(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert certificate["verdict"] == "GREEN" and certificate["probe"]["stopped"] is None
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", 8000)) != 0, "the step stops the server it started"


def test_the_recipe_names_the_certificate_and_the_run_it_keeps():
    step = _certify_step()
    assert set(step["env"]) == {"SERVER", "URL", "OUT"} and "bia certify \"$URL\"" in step["run"]
    kept = next(s for s in _workflow()["jobs"]["certify"]["steps"] if s.get("uses", "").startswith("actions/upload"))
    assert kept["with"]["path"] == "bia-certify/" == step["env"]["OUT"] + "/"


def test_the_recipe_fails_the_job_on_bia_serve_in_its_default_kernels(tmp_path):
    port = _free_port()
    done, certificate = _run_recipe(tmp_path, f".venv/bin/bia serve --port {port} --mode default -v", f"http://127.0.0.1:{port}",
                                    _small(tmp_path))
    assert done.returncode == 5, done.stdout + done.stderr
    assert certificate["verdict"] == "RED" and certificate["probe"]["stopped"] == "RED"
    assert done.stdout.splitlines()[0].startswith("RED bia-certify/run (copies): ")


def test_the_recipe_fails_the_job_on_llama_server(tmp_path, server_binary):
    from analysis.experiment import bundled_model
    from analysis.experiment.engines import MODEL_ALIAS, write_gguf

    pytest.importorskip("gguf")
    model = write_gguf(bundled_model(), tmp_path / "tiny.gguf")
    port = _free_port()
    server = (f"{server_binary} -m {model} --alias {MODEL_ALIAS} --host 127.0.0.1 --port {port} -np 4 -c 4096 --metrics --no-webui "
              "--no-cache-prompt -t 1")
    done, certificate = _run_recipe(tmp_path, server, f"http://127.0.0.1:{port}", _small(tmp_path))
    assert done.returncode == 5, done.stdout + done.stderr  # llama.cpp has no batch-invariant kernels: a batched request parts
    arm = certificate["arms"][0]
    assert arm["engine"] == "llama.cpp server" and arm["verdict"] == "RED" and arm["next_step"].startswith("batch-invariant kernels: llama-server")
