"""README's headline flow on a clean copy of the repository (issue 41): its set-up command, then its "Is my server
batch-invariant?" block exactly as written, pasted twice.

The block is extracted from README.md, never retyped, and run whole by bash from the copy's root. A ``BASH_ENV`` file
(read by bash before the block, not part of it) records each command's exit code, so that the certify line's code is
checked as the shell saw it. The copy is the repository's tracked files as they are in the working tree (a fresh clone's
content in CI), so the set-up creates its own ``.venv`` with nothing from this one.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT

HEADLINE = "## Is my server batch-invariant?"
TRACE = 'trap \'printf "%s\\t%s\\n" "$?" "$BASH_COMMAND" >> "$BIA_TRACE"\' DEBUG\n'  # before each command: the last one's code


def _fenced(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, flags=re.M | re.S)


def readme_setup_and_headline(readme: str) -> tuple[str, str]:
    """README's set-up command (the first line of its first block: the report) and the block under the headline."""
    setup = _fenced(readme)[0].splitlines()[0]
    section = readme[readme.index(HEADLINE) :]
    return setup, _fenced(section)[0]


def _clean_copy(target: Path) -> Path:
    """The repository's tracked files, as the working tree has them, copied to ``target``."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not in a clean copy either
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name, follow_symlinks=False)
    return target


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _codes(trace: Path) -> dict[str, list[int]]:
    """Each command's exit code from the trace: a line is (the previous command's code, the next command)."""
    lines = [line.split("\t", 1) for line in trace.read_text().splitlines()]
    codes: dict[str, list[int]] = {}
    for (_, command), (code, _) in itertools.pairwise(lines):
        codes.setdefault(command.split()[1] if command.startswith(".venv/bin/bia") else command.split()[0], []).append(int(code))
    return codes


def _outside_this_venv() -> dict[str, str]:
    """This process's variables without what ties a child to the test suite's own environment."""
    drop = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "BASH_ENV"}
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if ".venv" not in p)
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PATH": path}


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


@pytest.mark.slow
@pytest.mark.engine
def test_the_headline_block_works_pasted_twice_after_the_readme_set_up(tmp_path):
    setup, block = readme_setup_and_headline((ROOT / "README.md").read_text())
    assert setup.startswith("bash scripts/report.sh") and "bia certify http://127.0.0.1:8000" in block
    port = int(re.search(r"--port (\d+)", block).group(1))
    assert _port_free(port), f"port {port} is taken on this machine; README's block needs it"
    checkout = _clean_copy(tmp_path / "bia")
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", setup], cwd=checkout, capture_output=True, text=True, timeout=1800, env=_outside_this_venv())
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    set_up_s, lean = time.monotonic() - started, _du(checkout / ".venv")
    (tmp_path / "trace.sh").write_text(TRACE)
    certificates, runs, timings = [], [], []
    for paste in (1, 2):
        trace = tmp_path / f"trace-{paste}.tsv"
        started = time.monotonic()
        done = subprocess.run(["bash", "-c", block], cwd=checkout, capture_output=True, text=True, timeout=1800,
                              env={**_outside_this_venv(), "BASH_ENV": str(tmp_path / "trace.sh"), "BIA_TRACE": str(trace)})
        timings.append(time.monotonic() - started)
        said = done.stdout + done.stderr
        codes = _codes(trace)
        stated = int(re.search(r"#.*\bexit (\d+)\b", next(line for line in block.splitlines() if "certify" in line)).group(1))
        assert codes.get("certify") == [stated] == [5], f"paste {paste}: {codes}\n{said}"
        assert all(code == 0 for code in codes["BIA_EXTRAS=torch"]), said  # the extra's set-up (the block's first line)
        assert "stopped early: a request parted" in said and "Traceback" not in said
        certificate = json.loads((checkout / "certificate.json").read_text())
        assert certificate["verdict"] == "RED" and certificate["exit_code"] == 5
        certificates.append(certificate)
        runs.append(certificate["probe"]["run"])
        assert (checkout / runs[-1] / "manifest.json").is_file()
        assert _port_free(port), f"paste {paste} left a server on port {port}"
    assert runs[0] != runs[1], "each certification keeps its own run"
    assert [c["arms"][0]["verdict"] for c in certificates] == ["RED", "RED"]
    print(f"\nREADME set-up: {set_up_s:.0f} s, .venv {lean / 1e9:.2f} GB; headline block: first paste {timings[0]:.0f} s, "
          f"second {timings[1]:.0f} s; .venv after {_du(checkout / '.venv') / 1e9:.2f} GB")


def test_readme_names_its_blocks_as_the_test_reads_them():
    """The extraction the test above relies on, checked on its own (fast): the set-up is the report, the headline block starts
    bia serve in the background and stops it."""
    setup, block = readme_setup_and_headline((ROOT / "README.md").read_text())
    assert shlex.split(setup, comments=True)[:2] == ["bash", "scripts/report.sh"]
    assert "& server=$!" in block and "kill $server; wait $server" in block


def test_readme_says_which_commands_install_every_extra():
    """Issue 41: docs.sh and make check installed every extra (2.6 GB) and README did not say so. Each script that runs the
    full set-up (scripts/setup.sh with its default extras) is named in README beside that size."""
    full = sorted(path.name for path in (ROOT / "scripts").glob("*.sh")
                  if re.search(r"^bash scripts/setup\.sh\b", path.read_text(), flags=re.M) and path.name != "mutation.sh")
    assert full == ["check.sh", "docs.sh", "test.sh"]
    readme = (ROOT / "README.md").read_text()
    named = {"check.sh": "make check", "docs.sh": "scripts/docs.sh", "test.sh": "scripts/test.sh"}
    for script in full:
        at = readme.index(named[script])
        assert "2.6 GB" in readme[max(0, at - 400) : at + 400], f"README names {named[script]} without the extras' size"
