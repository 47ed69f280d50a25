"""Serving ``bia serve``'s app: on a port until Ctrl-C (the CLI's), or in a thread of this process (:class:`BackgroundServer`)."""

from __future__ import annotations

import logging
import time
from typing import Self

import torch

from ._app import create_app
from ._engine import BATCH_WINDOW_MS, LOG


def serve(app, host: str, port: int, *, said: str, say=None) -> bool:
    """Serve ``app`` on ``host:port`` until stopped (Ctrl-C); once it listens, ``say`` (a line to stdout by default) gets
    ``bia serve: listening on http://HOST:PORT (said)``, the port the one bound (``port=0`` picks a free one). False when it
    could not listen there (uvicorn logs why: the port in use, an address not of this host).

    Parameters
    ----------
    app : starlette.applications.Starlette
        The app, as :func:`create_app` makes it.
    host : str
        The address to listen on.
    port : int
        The port; 0 picks a free one.
    said : str
        What is served, in the listening line's parentheses.
    say : callable, optional
        Gets the listening line; ``print`` to stdout when None.

    Returns
    -------
    bool
        Whether it listened.
    """
    import uvicorn

    say = say or (lambda line: print(line, flush=True))

    class Announcing(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:  # bound and listening (a port in use stops the server instead, with uvicorn's error)
                bound = self.servers[0].sockets[0].getsockname()
                name = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
                say(f"bia serve: listening on http://{name}:{bound[1]} ({said}); Ctrl-C stops it")

    server = Announcing(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    try:
        server.run()
    except KeyboardInterrupt:  # Ctrl-C stops it, as uvicorn.run does
        pass
    except (
        SystemExit
    ):  # uvicorn's own exit when it cannot start (its exit 3, bia's code for a missing path): the caller says so
        if server.started:
            raise
    return server.started


class BackgroundServer:
    """``bia serve`` in a thread of this process, on a free loopback port: for notebooks and tests.

    With ``log_file``, the per-step ``Batch m=N done`` lines also go to that file, for the probe's
    ``server_log``. ``batch_window_ms`` and ``max_batch`` are ``bia serve``'s options of those names (see
    :class:`~analysis.serve.Engine`). Use it as a context manager, or call :meth:`stop`.

    Examples
    --------
    >>> with BackgroundServer("fixed-tiles") as server:  # doctest: +SKIP
    ...     run_dir = asyncio.run(probe(server.url, "runs/demo", prompts=["If the argument is"], server_log=server.log_file))
    """

    def __init__(
        self,
        mode: str = "default",
        *,
        model_path=None,
        log_file=None,
        dtype: str = "float32",
        device: str = "cpu",
        batch_window_ms: float = BATCH_WINDOW_MS,
        max_batch: int | None = None,
    ) -> None:
        import socket
        import threading
        from pathlib import Path

        import uvicorn

        from ..experiment import bundled_model
        from ..experiment.model import load_model

        weights = Path(model_path) if model_path else bundled_model()
        self.log_file = Path(log_file) if log_file else None
        self._handler = None
        if self.log_file is not None:
            self._handler = logging.FileHandler(self.log_file)
            self._handler.setFormatter(logging.Formatter("%(message)s"))
            LOG.addHandler(self._handler)
            LOG.setLevel(logging.INFO)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        app = create_app(
            load_model(weights, getattr(torch, dtype), device),
            mode,
            weights.stem,
            batch_window_ms=batch_window_ms,
            max_batch=max_batch,
        )
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.time() + 30
        while not self._server.started:
            if time.time() > deadline or not self._thread.is_alive():
                self.stop()
                raise RuntimeError(f"bia serve did not start on {self.url}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server and its log file."""
        self._server.should_exit = True
        self._thread.join(timeout=10)
        if self._handler is not None:
            LOG.removeHandler(self._handler)
            self._handler.close()
            self._handler = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
