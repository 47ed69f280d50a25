"""Outputs (issue 32 item 1): every command that writes checks that it can before any work, and writes through a temporary
file renamed into place, so that an error or a kill mid-way leaves no half-written file."""

from __future__ import annotations

import subprocess

import pytest
from _cli import bia, start_bia
from conftest import ROOT

from analysis.core._output import write_atomic

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("command", [
    ["report", "data/aprender-lambda", "-o", "{blocked}/r.html"],
    ["certify", "data/experiment-cpu/default", "-o", "{blocked}/c.json"],
    ["history", "data/experiment-cpu/default", "-o", "{blocked}/history"],
    ["probe", "http://127.0.0.1:9", "-o", "{blocked}/run"],
    ["experiment", "-o", "{blocked}/runs", "--modes", "default"],
    ["assemble", "tests/samples/vllm_chat_nonstream_token_ids__OpenPipe-ART.json", "-o", "{blocked}/run", "--band-per-file"],
])
def test_an_output_under_a_file_is_refused_in_one_line_before_any_work(command, tmp_path):
    """Issue 32 item 1: -o afile/r.html under a regular file ended in a FileExistsError traceback after the work. Every command
    that writes now says so in one line, exit 2, before it reads or fires anything (the probe's port 9 is never asked)."""
    blocked = tmp_path / "afile"
    blocked.write_text("a file, not a folder")
    words = [word.format(blocked=blocked) for word in command]
    done = bia(*words, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and lines[0].endswith(f"cannot be written: {blocked} is a file, not a folder")
    assert blocked.read_text() == "a file, not a folder"


def test_a_write_that_fails_mid_way_leaves_the_old_file_and_no_partial_one(tmp_path):
    target = write_atomic(tmp_path / "certificate.json", '{"verdict": "GREEN"}\n')
    with pytest.raises(UnicodeEncodeError):
        write_atomic(target, '{"verdict": "RED", "why": "\ud800"}')  # a lone surrogate: the encoder fails part-way through the write
    assert target.read_text() == '{"verdict": "GREEN"}\n' and [p.name for p in tmp_path.iterdir()] == ["certificate.json"]


def test_ctrl_c_during_a_report_is_one_line_exit_130_and_leaves_the_old_report(tmp_path):
    """Issue 32 item 3: Ctrl-C during bia report printed a 20-line zmq traceback from the kernel and no "interrupted" line."""
    import signal
    import time

    old = tmp_path / "r.html"
    old.write_text("yesterday's report")
    child = start_bia("report", "-o", str(old), "--force")
    time.sleep(8)  # the notebook is running by now (its kernel starts in about 2 s)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 130 and out == ""
    assert err == "interrupted: bia report stopped before it finished; what it writes is written whole or not at all\n"
    assert old.read_text() == "yesterday's report" and [p.name for p in tmp_path.iterdir()] == ["r.html"]


def test_a_ctrl_c_while_a_notebook_runs_turns_logging_off_and_the_handler_is_given_back():
    # what nbclient and asyncio log while the kernel is stopped mid-cell is noise after the command's one line; the
    # interrupt above hits a cell only some of the time, so the handler is checked here on its own
    import logging
    import os
    import signal
    import time

    from analysis.cli._args import _quiet_after_interrupt

    before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt), _quiet_after_interrupt():
            assert logging.root.manager.disable == logging.NOTSET
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises at once
        assert logging.root.manager.disable == logging.CRITICAL
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        logging.disable(logging.NOTSET)


def test_the_main_job_runs_from_any_folder_and_writes_where_the_user_stands(tmp_path):
    """Issue 32 item 10: scripts/report.sh wrote its report into the checkout, whatever folder it was run from."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "report.sh"), "-o", "here.html", str(ROOT / "data" / "aprender-lambda")],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "here.html").is_file() and not (ROOT / "here.html").exists()
    from analysis.core._output import _umask

    assert (tmp_path / "here.html").stat().st_mode & 0o777 == 0o666 & ~_umask()  # as any written file, not a temporary file's 0600


def test_ctrl_c_during_an_experiment_leaves_no_half_run(tmp_path):
    """Issue 32 item 3: a mode's run is built aside and renamed into place whole, so an interrupt leaves no folder that a
    second try would refuse as "already exists", and no run without its manifest."""
    import signal
    import time

    child = start_bia("experiment", "-o", str(tmp_path / "runs"), "--modes", "default")
    deadline = time.time() + 60
    while not (tmp_path / "runs" / ".default.partial" / "captures").is_dir():  # decoding has begun
        assert child.poll() is None and time.time() < deadline
        time.sleep(0.1)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 130 and out == ""
    assert err == "interrupted: bia experiment stopped before it finished; what it writes is written whole or not at all\n"
    assert list((tmp_path / "runs").iterdir()) == []
