"""Small real HTTP servers on loopback that act on purpose, for the probe's tests (bia serve itself runs as analysis.serve.BackgroundServer)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


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
