"""What starting a real server on loopback needs, whatever the engine: a free port, the tail of its log, and a wait for
its ``/health``. llama.cpp's and vLLM's starters share these."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx

from ...core import duration

MODEL_ALIAS = "bia-tiny-byte-lm"  # the name llama.cpp and vLLM serve bia's model under


def free_port() -> int:
    """A TCP port nothing listens on at 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` of a server's log, for an error message.

    Parameters
    ----------
    path : pathlib.Path
        The log file.
    lines : int, default 15
        How many lines to keep.

    Returns
    -------
    str
        Those lines, or ``(no log)`` when the file cannot be read.
    """
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_healthy(
    process: subprocess.Popen,
    url: str,
    log: Path,
    startup_s: float,
    *,
    name: str,
    error: type[Exception],
    poll_s: float,
    tail_lines: int = 15,
) -> None:
    """Wait until ``url/health`` answers 200; ``error`` (naming ``name`` and the log's tail) when the process exits or time runs out.

    Parameters
    ----------
    process : subprocess.Popen
        The server's process.
    url : str
        The server's base URL (``http://127.0.0.1:PORT``).
    log : pathlib.Path
        The file the server logs to.
    startup_s : float
        How long to wait, in seconds.
    name : str
        The server's name in the error.
    error : type of Exception
        The error to raise.
    poll_s : float
        Seconds between two tries.
    tail_lines : int, default 15
        How many of the log's last lines the error quotes.
    """
    deadline = time.monotonic() + startup_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise error(f"{name} exited with {process.returncode} while starting:\n{tail(log, tail_lines)}")
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    raise error(f"{name} did not answer {url}/health within {duration(startup_s)}:\n{tail(log, tail_lines)}")
