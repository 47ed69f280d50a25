"""The one way the tests run the ``bia`` command: ``python -m analysis`` in a child process, as a shell runs the console script.

``bia(*args)`` runs it to its end and returns the completed process (exit code, stdout and stderr as text); ``start_bia(*args)``
starts it and returns at once (a server, or a probe to interrupt). What a test needs beyond that is a parameter: the working
folder, variables over this process's environment, a time limit, stderr on a pseudo-terminal (progress bars show only there).
"""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIA = (sys.executable, "-m", "analysis")  # what the bia console script runs (pyproject's [project.scripts])


def bia(*args: str | os.PathLike[str], cwd: str | os.PathLike[str] | None = ROOT, env: Mapping[str, str] | None = None,
        timeout: float = 300, terminal: bool = False, **run: Any) -> subprocess.CompletedProcess[str]:
    """Run ``bia ARGS`` to its end, from ``cwd`` (the repository root by default), with ``env`` set over this process's
    variables; ``terminal`` puts its stderr on a pseudo-terminal 120 columns wide (stdin is never one). ``run`` goes to
    :func:`subprocess.run` (``preexec_fn``, ``input``...)."""
    command = [*BIA, *map(str, args)]
    environment = {**os.environ, **(env or {})}
    if terminal:
        return _on_terminal(command, cwd=cwd, env=environment, timeout=timeout)
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=environment, timeout=timeout, check=False, **run)


def start_bia(*args: str | os.PathLike[str], cwd: str | os.PathLike[str] | None = ROOT, env: Mapping[str, str] | None = None,
              **popen: Any) -> subprocess.Popen[str]:
    """Start ``bia ARGS`` and return at once: its stdout and stderr piped as text, unbuffered (so that a test reads each line as
    it is said), ``env`` over this process's variables; ``popen`` goes to :class:`subprocess.Popen`."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen([*BIA, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=environment,
                            **popen)


def _on_terminal(command: list[str], *, cwd, env, timeout: float) -> subprocess.CompletedProcess[str]:
    """The command with its stderr a pseudo-terminal (stdout piped), read as it comes so that a full buffer never blocks it."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a terminal 120 columns wide, as a user's
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=follower, text=True, cwd=cwd, env=env)
    os.close(follower)
    seen: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(leader, 4096)
            except OSError:  # EIO: the child closed its end
                return
            if not data:
                return
            seen.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out, _ = child.communicate(timeout=timeout)
    reader.join(timeout=10)
    os.close(leader)
    return subprocess.CompletedProcess(command, child.returncode, out, b"".join(seen).decode("utf-8", "replace"))
