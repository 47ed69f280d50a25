"""The examples README and docs/ show run as written from a fresh checkout's root, on the bundled data (issue 22, item 7).

Each runs in a scratch folder that holds ``data`` (a link to the repository's), so what an example writes
(certificate.json, study/, a Parquet dump) lands there and not in the checkout.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import bia
from conftest import ROOT

pytestmark = pytest.mark.slow

DOCS = sorted((ROOT / "docs").rglob("*.md"))  # README's Python is run by test_packaging
BIA = (".venv/bin/bia", "bia")
SERVED = "http://127.0.0.1:8000"  # README's server block: bia serve started in the background, then certified


def _fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.M | re.S)


def _checkout_root(tmp_path: Path) -> Path:
    """A folder that looks like the repository's root to an example: its ``data`` is the bundled data."""
    (tmp_path / "data").symlink_to(ROOT / "data", target_is_directory=True)
    return tmp_path


def _readme_bia_commands() -> list[tuple[list[str], int]]:
    """Each ``bia`` command line in README's shell blocks, with the exit code its comment states (``# ... exit 5``; 0 if none)."""
    commands = []
    for block in _fenced((ROOT / "README.md").read_text(), "bash"):
        if SERVED in block:  # the server block: run whole, twice, on a clean copy (test_readme_flow)
            continue
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] in BIA:
                stated = re.search(r"#.*\bexit (\d+)\b", line)
                commands.append((words[1:], int(stated.group(1)) if stated else 0))
    return commands


def _python_examples() -> list[tuple[str, str]]:
    return [(f"{doc.relative_to(ROOT)}#{k}", block) for doc in DOCS for k, block in enumerate(_fenced(doc.read_text(), "python"))]


def test_readme_shows_bia_commands():
    assert [words[0] for words, _ in _readme_bia_commands()] == ["certify"]


@pytest.mark.parametrize(("words", "exit_code"), _readme_bia_commands(), ids=lambda value: " ".join(value) if isinstance(value, list) else None)
def test_every_bia_command_in_readme_runs_as_written(words, exit_code, tmp_path):
    """README's ``bia certify`` once named runs/probe, a folder a fresh checkout does not have (exit 3)."""
    done = bia(*words, cwd=_checkout_root(tmp_path), timeout=300)
    assert done.returncode == exit_code, f"bia {' '.join(words)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    assert "Traceback" not in done.stderr


def test_the_readme_certify_example_says_what_the_bundled_runs_give(tmp_path):
    """What README says the example prints: the default mode RED (its logprobs part from m=1 from c=4), the three invariant
    modes AMBER. Each run holds 2 prompts x (4 + 8 + 16) batched requests = 56 (the c=1 requests are sent alone, no batch),
    all bit-identical in those modes, and 0 divergences in 56 bound the rate only at 1 - 0.05^(1/56) = 5.21% (95%), not
    below the 1% target; 299 would, so the next step asks ceil(299 / 28) = 11 prompts."""
    (words, _), = _readme_bia_commands()
    done = bia(*words, cwd=_checkout_root(tmp_path), timeout=300)
    verdicts = {mode: verdict for verdict, mode in re.findall(r"^(\w+) \S*experiment-cpu/([\w-]+) ", done.stdout, flags=re.M)}
    assert verdicts == {"batch-invariant": "AMBER", "default": "RED", "fixed-tiles": "AMBER", "row-invariant": "AMBER"}
    assert "0 of 56 batched requests part from m=1" in done.stdout and "5.21%" in done.stdout
    assert "next: 243 more batched requests: bia experiment --prompts FILE of 11 prompts" in done.stdout
    assert (tmp_path / "certificate.json").is_file() and not (ROOT / "certificate.json").exists()


@pytest.mark.parametrize(("where", "block"), _python_examples(), ids=[where for where, _ in _python_examples()])
def test_every_python_example_in_the_docs_runs_as_written(where, block, tmp_path):
    """docs/dumps.md and docs/runs.md once read "captures/" and "run/", folders a fresh checkout does not have."""
    if "engine=\"ray\"" in block:
        pytest.importorskip("ray")
    done = subprocess.run([sys.executable, "-c", block], cwd=_checkout_root(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{where} failed:\n{block}\n{done.stderr[-2000:]}"
