"""Small real HTTP servers on loopback that act on purpose, for the probe's tests (bia serve itself runs as analysis.serve.BackgroundServer)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class _Backlogged(ThreadingHTTPServer):
    request_queue_size = 128  # the default 5 makes a band's 6th connection wait a SYN retry (about 1 s) to be accepted


class HttpServer:
    """A threading HTTP server on loopback answering with ``handler``."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = _Backlogged(("127.0.0.1", 0), handler)
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


def stream_words(handler: BaseHTTPRequestHandler, words: list[str], *, logprobs: bool = True, pause: float = 0.0, together: float | None = None,
                 stream_mode: str | None = None) -> None:
    """Answer with a chat completion stream of ``words`` (one token each, logprob -0.1 and itself as its one
    candidate, unless ``logprobs`` is false), a usage chunk and [DONE]; then close the connection.

    ``pause`` seconds pass before each word (a server decoding live); ``together`` holds every chunk
    back that many seconds and sends them in one write (a server that buffers, then bursts);
    ``stream_mode`` is declared on every chunk."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Connection", "close")
    handler.end_headers()
    held = []
    for word in words:
        entry = {"token": word, "logprob": -0.1, "top_logprobs": [{"token": word, "logprob": -0.1}]}
        chunk = {"choices": [{"index": 0, "delta": {"content": word}, "logprobs": {"content": [entry]} if logprobs else None}]}
        if stream_mode is not None:
            chunk["stream_mode"] = stream_mode
        data = f"data: {json.dumps(chunk)}\n\n".encode()
        if together is not None:
            held.append(data)
            continue
        time.sleep(pause)
        handler.wfile.write(data)
    if held:
        time.sleep(together)
        handler.wfile.write(b"".join(held))
    usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": len(words), "total_tokens": 1 + len(words)}}
    handler.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
    handler.close_connection = True
