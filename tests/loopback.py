"""Real servers on loopback for the probe's tests: bia serve in a thread, and small HTTP servers that act on purpose."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self


class BiaServer:
    """``bia serve``'s app under uvicorn in a thread; with ``log``, its per-step batch lines also go to that file."""

    def __init__(self, mode: str, log: Path | None = None) -> None:
        import uvicorn

        from analysis.experiment import bundled_model
        from analysis.experiment.model import load_model
        from analysis.serve import create_app

        self.handler = None
        if log is not None:
            self.handler = logging.FileHandler(log)
            logger = logging.getLogger("bia.serve")
            logger.addHandler(self.handler)
            logger.setLevel(logging.INFO)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        app = create_app(load_model(bundled_model()), mode)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started and time.time() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        if self.handler is not None:
            logging.getLogger("bia.serve").removeHandler(self.handler)
            self.handler.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class HttpServer:
    """A ThreadingHTTPServer on loopback whose handler class is built by ``make(server)``."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Quiet(BaseHTTPRequestHandler):
    """A handler base that logs nothing and answers JSON or bytes in one call."""

    def log_message(self, *args) -> None:
        pass

    def answer(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def routes(table: dict[str, Callable[[Quiet], None]]) -> type[Quiet]:
    """A handler answering GET and POST by path from ``table``; 404 elsewhere."""

    class Routed(Quiet):
        def do_GET(self) -> None:
            table.get(f"GET {self.path}", lambda h: h.answer(404, b"{}"))(self)

        def do_POST(self) -> None:
            table.get(f"POST {self.path}", lambda h: h.answer(404, b"{}"))(self)

    return Routed
