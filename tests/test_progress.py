"""Progress on a terminal, silence when piped (issue 32 item 8): the real CLI, its stderr a pseudo-terminal or a pipe."""

from __future__ import annotations

import pytest
from _cli import bia

from analysis.serve import BackgroundServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("If the argument is\n")
    return path


def test_experiment_shows_a_bar_with_its_eta_on_a_terminal_and_nothing_when_piped(tmp_path, prompts):
    """It ran 5 min 37 s with no output at all. One sequence per reference decode (3 per prompt) and per batch row (1 + 2), then
    the replay with taps (1 + 1 + 2): 10 sequences."""
    args = ["experiment", "--prompts", str(prompts), "--ladder", "1,2", "--modes", "default", "--max-tokens", "4", "--top-k", "2"]
    done = bia(*args, "-o", str(tmp_path / "tty"), terminal=True)
    assert done.returncode == 0, done.stderr
    assert "default: decoding" in done.stderr and "default: first ops" in done.stderr and "10/10" in done.stderr and "seq/s" in done.stderr
    assert "<" in done.stderr  # tqdm's elapsed<remaining: the ETA
    done = bia(*args, "-o", str(tmp_path / "pipe"), terminal=False)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "seq" not in done.stdout and "done" not in done.stdout  # nothing of the bar on stdout either


@pytest.mark.engine
def test_probe_shows_bands_and_requests_on_a_terminal_and_nothing_when_piped(tmp_path, prompts):
    with BackgroundServer("default") as server:
        args = ["probe", server.url, "--prompts", str(prompts), "--ladder", "1,2", "--max-tokens", "4", "--declared-min", "2"]
        done = bia(*args, "-o", str(tmp_path / "tty"), terminal=True)
        assert done.returncode in (0, 5, 7, 8), done.stderr  # the verdict's code: bits may part in the default mode
        assert "bands" in done.stderr and "requests" in done.stderr and "100%" in done.stderr
        done = bia(*args, "-o", str(tmp_path / "pipe"), terminal=False)
    assert "bands:" not in done.stderr and "requests:" not in done.stderr and "%|" not in done.stderr


def test_report_shows_its_cells_on_a_terminal_and_nothing_when_piped(tmp_path):
    args = ["report", "data/experiment-cpu/default"]
    done = bia(*args, "-o", str(tmp_path / "tty.html"), terminal=True)
    assert done.returncode == 0, done.stderr
    assert "cell" in done.stderr and "100%" in done.stderr
    done = bia(*args, "-o", str(tmp_path / "pipe.html"), terminal=False)
    assert done.returncode == 0 and "%|" not in done.stderr, done.stderr


def test_history_over_several_runs_shows_them_on_a_terminal_and_nothing_when_piped(tmp_path):
    done = bia("history", "data/experiment-cpu", "-o", str(tmp_path / "tty"), terminal=True)
    assert done.returncode == 0, done.stderr
    assert "reading runs" in done.stderr and "4/4" in done.stderr
    done = bia("history", "data/experiment-cpu", "-o", str(tmp_path / "pipe"), terminal=False)
    # piped: no bar, only the notes every command gives for a file it skips (the folder's sampler-trainer pairs)
    assert done.returncode == 0 and "reading runs" not in done.stderr, done.stderr
    assert all(line.startswith("note: skipped data/experiment-cpu/trainer/") for line in done.stderr.splitlines()), done.stderr
