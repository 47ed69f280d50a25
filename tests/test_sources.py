"""URL sources against a real HTTP server on loopback: cache, size limit, time-out, errors."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import V2_WITNESS

from analysis import SourceError, fetch_url, read_witnesses, shape_check

BODY = V2_WITNESS.read_bytes()


class _Handler(BaseHTTPRequestHandler):
    hits: dict[str, int] = {}
    conditional: list[str] = []  # the If-None-Match of each request to /w.json
    body = BODY  # what /w.json serves now; its ETag follows the bytes

    def log_message(self, *args):  # keep test output clean
        pass

    def do_GET(self):
        try:
            self._route()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up first, as the time-out and size-limit tests intend

    def _route(self):
        _Handler.hits[self.path] = _Handler.hits.get(self.path, 0) + 1
        if self.path == "/w.json":
            etag = f'"{len(_Handler.body)}-{hash(_Handler.body) & 0xFFFF}"'
            _Handler.conditional.append(self.headers.get("If-None-Match"))
            if self.headers.get("If-None-Match") == etag:
                self.send_response(304)
                self.send_header("ETag", etag)
                self.end_headers()
                return
            self._send(200, _Handler.body, {"ETag": etag})
        elif self.path == "/no-validators":
            self._send(200, BODY)
        elif self.path == "/announced-big":
            self.send_response(200)
            self.send_header("Content-Length", str(10_000_000))
            self.end_headers()
        elif self.path == "/unannounced-big":
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            for _ in range(64):
                self.wfile.write(b"x" * 4096)
        elif self.path == "/slow":
            time.sleep(2)
            self._send(200, BODY)
        elif self.path == "/not-json":
            self._send(200, b"<html>login page</html>")
        else:
            self._send(404, b"no")

    def _send(self, status, body, headers=None):
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setenv("BIA_CACHE_DIR", str(tmp_path / "cache"))
    _Handler.hits, _Handler.conditional, _Handler.body = {}, [], BODY
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_cached_url_is_revalidated_and_a_changed_one_read_anew(server, tmp_path):
    url = f"{server}/w.json"
    first = read_witnesses(url)
    assert first.sources == [url]
    assert first.bands["c"].to_list() == [1, 4, 8, 16]
    assert first.witnesses["source"].to_list() == [url]
    second = read_witnesses([url])
    assert second.bands["result"].to_list() == first.bands["result"].to_list()
    etag = f'"{len(BODY)}-{hash(BODY) & 0xFFFF}"'
    assert _Handler.conditional == [None, etag]  # the second read asked "changed since?" and got 304
    cached = fetch_url(url)
    assert cached.read_bytes() == BODY and cached.parent == tmp_path / "cache"
    _Handler.body = BODY.replace(b'"divergence_at": 3', b'"divergence_at": 2', 1)  # the witness is rewritten on the server
    assert fetch_url(url).read_bytes() == _Handler.body  # tonight's bytes, not the first night's
    fetch_url(url, refresh=True)
    assert _Handler.conditional[-1] is None  # refresh asks without validators


def test_a_url_without_validators_is_fetched_whole_each_time(server):
    url = f"{server}/no-validators"
    fetch_url(url)
    fetch_url(url)
    assert _Handler.hits["/no-validators"] == 2


def test_offline_reads_the_cache_only(server, tmp_path, monkeypatch):
    url = f"{server}/w.json"
    with pytest.raises(SourceError, match="offline, and the cache .* holds no copy of it"):
        fetch_url(url, offline=True)
    fetch_url(url)
    monkeypatch.setenv("BIA_OFFLINE", "1")
    assert read_witnesses(url).witnesses.height == 1
    assert _Handler.hits["/w.json"] == 1


def test_shape_check_reads_urls(server):
    verdict = shape_check(f"{server}/w.json")
    assert verdict.exit_code == 5 and verdict.source == f"{server}/w.json"


def test_http_error_names_the_url(server):
    with pytest.raises(SourceError, match=r"/missing: HTTP 404"):
        read_witnesses(f"{server}/missing")


def test_size_limit_announced_and_streamed(server, tmp_path):
    with pytest.raises(SourceError, match="exceeds the limit of 1000 bytes"):
        fetch_url(f"{server}/announced-big", max_bytes=1000)
    with pytest.raises(SourceError, match="body exceeds the limit of 100000 bytes"):
        fetch_url(f"{server}/unannounced-big", max_bytes=100_000)
    assert not list((tmp_path / "cache").glob("*.body")), "a refused download must not be cached"
    assert not list((tmp_path / "cache").glob("*.part")), "no partial file is left behind"


def test_timeout(server):
    with pytest.raises(SourceError, match="timed out after 0.3 s"):
        read_witnesses(f"{server}/slow", timeout=0.3)


def test_a_page_that_is_not_a_witness(server):
    from analysis import WitnessError

    with pytest.raises(WitnessError, match="not valid JSON") as info:
        read_witnesses(f"{server}/not-json")
    assert info.value.source == f"{server}/not-json"


def test_unreachable_server(tmp_path, monkeypatch):
    monkeypatch.setenv("BIA_CACHE_DIR", str(tmp_path))
    with pytest.raises(SourceError, match="ConnectError"):
        fetch_url("http://127.0.0.1:9/w.json", timeout=2)
