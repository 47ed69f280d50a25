"""Run a real llama.cpp server (``llama-server``) on loopback, serving bia's byte-level model.

``scripts/build_llama_server.sh`` builds the server once per machine from the llama.cpp source that
``llama-cpp-python==0.3.36`` vendors; :func:`~analysis.experiment.engines.gguf.write_gguf` writes the model
it serves. The tests and ``scripts/llamacpp_runs.py`` (the bundled llama.cpp runs) start it here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ._servers import MODEL_ALIAS, free_port, tail, wait_healthy

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # the source distribution whose vendored llama.cpp is built


class LlamaServerError(RuntimeError):
    """llama-server is missing, or did not start, or stopped: the message holds its log's tail."""


def find_llama_server() -> Path | None:
    """The llama-server binary to use: ``$BIA_LLAMA_SERVER``, else the one
    ``scripts/build_llama_server.sh`` caches, else one on ``PATH``; None when there is none.

    Examples
    --------
    >>> found = find_llama_server()
    >>> found is None or found.name == "llama-server"
    True
    """
    given = os.environ.get("BIA_LLAMA_SERVER")
    if given:
        return Path(given)
    cache = Path(os.environ.get("BIA_CACHE") or Path.home() / ".cache" / "bia")
    built = cache / "llama.cpp" / LLAMA_CPP_PYTHON_VERSION / "bin" / "llama-server"
    if built.is_file() and os.access(built, os.X_OK):
        return built
    on_path = shutil.which("llama-server")
    return Path(on_path) if on_path else None


@contextlib.contextmanager
def llama_server(
    model: str | os.PathLike[str],
    *,
    binary: str | os.PathLike[str] | None = None,
    parallel: int = 16,
    slot_context: int = 256,
    cache_prompt: bool = True,
    threads: int | None = None,
    log: str | os.PathLike[str] | None = None,
    startup_s: float = 60.0,
) -> Iterator[str]:
    """Start ``llama-server`` on a free loopback port with ``--metrics``, yield its base URL, stop it at exit.

    Parameters
    ----------
    model : path
        The GGUF file to serve (see :func:`~analysis.experiment.engines.gguf.write_gguf`); served as
        ``bia-tiny-byte-lm``.
    binary : path, optional
        The server binary (:func:`find_llama_server` by default).
    parallel : int
        Slots (``-np``): how many requests decode together in one batch.
    slot_context : int
        Context per slot; the total (``-c``) is ``parallel * slot_context``.
    cache_prompt : bool
        False adds ``--no-cache-prompt``: no slot reuses a previous request's prompt KV.
    threads : int, optional
        CPU threads (``-t``); llama.cpp's default otherwise.
    log : path, optional
        Where the server's output goes (a temporary file by default, shown when it fails).
    startup_s : float
        How long to wait for ``/health`` to answer 200.

    Examples
    --------
    >>> from analysis.experiment.engines import write_gguf
    >>> import analysis.experiment as ex, httpx, tempfile
    >>> if find_llama_server():  # doctest: +SKIP
    ...     gguf = write_gguf(ex.bundled_model(), Path(tempfile.mkdtemp()) / "m.gguf")
    ...     with llama_server(gguf, parallel=4) as url:
    ...         httpx.get(url + "/health").status_code
    200
    """
    binary = Path(binary) if binary else find_llama_server()
    if binary is None or not binary.exists():
        raise LlamaServerError(
            "no llama-server: run scripts/build_llama_server.sh (once per machine) or set BIA_LLAMA_SERVER"
        )
    port = free_port()
    args = [
        str(binary),
        "-m",
        str(model),
        "--alias",
        MODEL_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-np",
        str(parallel),
        "-c",
        str(parallel * slot_context),
        "--metrics",
        "--no-webui",
    ]
    if not cache_prompt:
        args.append("--no-cache-prompt")
    if threads:
        args += ["-t", str(threads)]
    with contextlib.ExitStack() as stack:
        if log is None:
            log = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bia-llama-"))) / "llama-server.log"
        log = Path(log)
        out = stack.enter_context(open(log, "wb"))
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        stack.callback(_stop, process)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(process, url, log, startup_s, name="llama-server", error=LlamaServerError, poll_s=0.1)
        yield url
        if process.poll() is not None:
            raise LlamaServerError(f"llama-server stopped while in use (exit {process.returncode}):\n{tail(log)}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
