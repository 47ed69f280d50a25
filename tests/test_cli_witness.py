"""``bia witness``: the terminal table of witnesses and bands."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from _cli import bia
from conftest import LAMBDA, V2_WITNESS, write_json
import pytest

pytestmark = pytest.mark.slow


def test_table_lists_every_band_and_verdict():
    run = bia("witness", str(LAMBDA), "--reasons")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    for header in ("host", "server commit", "version", "m_formed", "divergence_at", "margin", "decode tok/s", "result", "V3 verdict"):
        assert header in out
    assert out.count("NOT ADMISSIBLE (8)") == 2 and out.count("NOT ADMISSIBLE (5)") == 1
    witness_table = out.split("release markers")[0]
    rows = [line.split("│") for line in witness_table.splitlines() if "│" in line and line.split("│")[5].strip().isdigit()]
    assert len(rows) == 12
    assert [int(r[5]) for r in rows] == [1, 4, 8, 16] * 3
    v2 = [r for r in rows if "witness@464c168e62" in r[1]]
    assert len(v2) == 1 and "a765c86a5f" in v2[0][3] and v2[0][10].strip() == "PASS"
    assert "release markers" in out and "c554a7731d" in out
    assert "c=4: diverges from m=1 at 3 < 64 with no near-tie margin recorded" in out


def test_derived_result_disagreement_is_shown(tmp_path):
    data = json.loads(V2_WITNESS.read_text())
    data["bands"][2]["result"] = "FAIL"
    run = bia("witness", str(write_json(tmp_path / "w.json", data)))
    assert "FAIL (derived PASS)" in run.stdout
    assert "$.bands[2] (c=8).result: recorded FAIL, derived PASS" in run.stdout


def test_errors_name_the_file_and_field(tmp_path):
    bad = write_json(tmp_path / "bad.json", {"witness_version": 2, "bands": [{"c": 1, "slots": [{"i": "0"}]}]})
    run = bia("witness", str(bad))
    assert run.returncode == 4
    assert f"{bad}: $.bands[0] (c=1).slots[0].i: expected an integer" in run.stderr
    assert bia("witness", str(tmp_path / "absent.json")).returncode == 3


def test_a_run_directory_is_named_as_one_with_what_to_run_on_it(tmp_path):
    from conftest import ROOT

    run_dir = ROOT / "data" / "experiment-cpu" / "default"
    result = bia("witness", str(run_dir))
    assert result.returncode == 4
    assert "derived/manifest.json" not in result.stderr  # not a cache file of the run, but the run itself
    assert f"error: {run_dir} is a run directory, not a witness: bia report {run_dir} -o report.html reports it" in result.stderr
    assert f"bia shape-check {run_dir / 'witness.json'}" in result.stderr and "prompt_id='p0'" in result.stderr
    result = bia("witness", str(run_dir.parent))
    assert result.returncode == 4 and f"{run_dir.parent} holds run directories ({run_dir.parent / 'batch-invariant'}" in result.stderr


def _closed_port() -> int:
    """A loopback port nothing listens on: bound, then let go."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_url_nothing_answers_at_exits_6_not_the_missing_paths_3(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/witness.json"
    env = {"BIA_CACHE_DIR": str(tmp_path / "cache")}
    for command in (["witness", url], ["shape-check", url], ["report", url, "-o", str(tmp_path / "r.html")], ["history", url, "-o", str(tmp_path / "h")],
                    ["trend", url, "-o", str(tmp_path / "t.html")], ["assemble", url, "-o", str(tmp_path / "run")]):
        run = bia(*command, env=env)
        assert run.returncode == 6, (command, run.returncode, run.stderr)
        assert url in run.stderr and "Traceback" not in run.stderr, command
    assert bia("witness", str(tmp_path / "absent.json")).returncode == 3  # a path that does not exist keeps its own code


COMMANDS = ("shape-check", "witness", "assemble", "report", "experiment", "probe", "serve", "certify", "history", "trend")


def test_help_names_values_in_words_and_lists_whole_descriptions():
    """Issue 22: help showed Python types as metavars (<list[str]>, {url}) and bia --help cut each description with '...'."""
    env = {"COLUMNS": "80"}
    top = bia("--help", env=env).stdout
    listed = " ".join(top.split("Commands:")[1].split())
    assert "..." not in listed
    assert "trend The trend report: bands over time per host, engine and model, regressions flagged with the commits around them." in listed
    assert "witness A terminal table of witnesses and their bands, with the V3 verdict of each witness." in listed
    usages = {}
    for command in COMMANDS:
        page = bia(command, "--help", env=env).stdout
        assert not any(mark in page for mark in ("<str>", "<int>", "<path>", "<float>", "list[", "{url}", "{path}")), (command, page)
        usages[command] = page.splitlines()[0]
        if command == "probe":
            assert "--ladder C,C,..." in page and "--expect KEY=VALUE" in page and "--prompts PATH" in page and "--max-tokens INTEGER" in page
            assert re.search(r"^  URL +The server's base URL", page, re.M)
    assert usages["probe"] == "Usage: bia probe [OPTIONS] URL"
    assert usages["report"] == "Usage: bia report [OPTIONS] [SOURCE...]"
    assert usages["shape-check"] == "Usage: bia shape-check [OPTIONS] WITNESS"
    assert usages["certify"] == "Usage: bia certify [OPTIONS] RUN..."


def test_following_the_advice_for_a_run_directory_works(tmp_path):
    """Each command bia witness RUN_DIR gives, run as given, on a copy of the bundled fixed-tiles run: the Python line writes the
    witness, then bia witness and bia shape-check read it. The witness once carried the run's environment as it stood (a bool
    and an integer), where a witness's env holds strings or null, so bia could not read back what it wrote (exit 4)."""
    import shutil

    from conftest import ROOT

    import analysis

    run_dir = tmp_path / "ft"
    shutil.copytree(ROOT / "data" / "experiment-cpu" / "fixed-tiles", run_dir, ignore=shutil.ignore_patterns("derived"))
    advice = bia("witness", str(run_dir)).stderr
    write = re.search(r'\(python -c "(.*?)"\)', advice).group(1)
    assert subprocess.run([sys.executable, "-c", write], capture_output=True, text=True, timeout=120).returncode == 0
    advice = bia("witness", str(run_dir)).stderr
    assert f"its witness is {run_dir / 'witness.json'}: bia witness {run_dir / 'witness.json'}" in advice
    table = bia("witness", str(run_dir / "witness.json"))
    assert table.returncode == 0, table.stderr
    witnesses = analysis.read_witnesses([str(run_dir / "witness.json")], progress=False).witnesses
    # the manifest's environment: deterministic_algorithms true (a bool), threads 1 (an integer), cuda null, as JSON spells them
    assert witnesses.select("env_deterministic_algorithms", "env_threads", "env_cuda").row(0) == ("true", "1", None)
    assert bia("shape-check", str(run_dir / "witness.json")).returncode == 5  # read and judged: not aprender's blessed model
