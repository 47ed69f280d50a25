"""Where inputs come from: paths, directories, glob patterns and http(s) URLs.

URLs are fetched with httpx under a deadline for the whole download and a size limit, streamed to a
local cache so a report rerun offline reads what it read before.
"""

from __future__ import annotations

import asyncio
import glob
import hashlib
import json
import os
import tempfile
import time
import warnings
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import httpx

from ..core import duration

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
STALE_PART_S = (
    3600.0  # a *.part untouched this long belongs to a fetch that was killed: a live one writes within its deadline
)


class SourceError(OSError):
    """A source that could not be read: the message names it and says why."""


def is_url(source: str | os.PathLike[str]) -> bool:
    """True for an ``http://`` or ``https://`` address.

    Parameters
    ----------
    source : str or os.PathLike
        A source as given; a path object is never a URL.

    Returns
    -------
    bool

    Examples
    --------
    >>> is_url("https://example.org/w.json"), is_url("data/w.json")
    (True, False)
    """
    return isinstance(source, str) and source.lower().startswith(("http://", "https://"))


def cache_dir() -> Path:
    """The download cache: ``$BIA_CACHE_DIR``, else ``$XDG_CACHE_HOME/bia``, else ``~/.cache/bia``."""
    if os.environ.get("BIA_CACHE_DIR"):
        return Path(os.environ["BIA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "bia"


def fetch_url(
    url: str,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    max_bytes: int = DEFAULT_MAX_BYTES,
    cache: Path | None = None,
    refresh: bool = False,
    offline: bool | None = None,
) -> Path:
    """Fetch ``url`` into the cache, or revalidate the copy there, and return the cached file's path.

    A URL already in the cache is asked for again on every call with the validators the server gave
    (``If-None-Match`` for an ETag, ``If-Modified-Since`` for a Last-Modified date): a 304 keeps the
    copy, anything else replaces it, so a nightly report reads tonight's witness, not the first
    night's. A server that gives no validator is fetched whole again.

    Parameters
    ----------
    url : str
        An http(s) address.
    timeout : float
        Seconds allowed for the whole download: connecting, the headers and every byte of the body.
    max_bytes : int
        A body larger than this is refused, whether or not the server announced its length.
    cache : Path, optional
        The cache folder; ``cache_dir()`` by default.
    refresh : bool
        Fetch the whole body again, without validators.
    offline : bool, optional
        Use the cached copy only, never the network (a URL not cached is an error). By default
        true when the environment variable ``BIA_OFFLINE`` is set to 1 (``--offline`` sets it).

    Raises
    ------
    SourceError
        HTTP error status, transport failure, time-out, an oversized body, or offline without a copy.
    """
    folder = Path(cache) if cache is not None else cache_dir()
    key = hashlib.sha256(url.encode("utf-8")).hexdigest()[:32]
    body_path, meta_path = folder / f"{key}.body", folder / f"{key}.json"
    meta = _cached_meta(body_path, meta_path)
    if offline is None:
        offline = os.environ.get("BIA_OFFLINE", "") not in ("", "0")
    if offline:
        if meta is None:
            raise SourceError(f"{url}: offline, and the cache ({folder}) holds no copy of it")
        return body_path
    validators = {} if refresh or meta is None else _validators(meta)
    folder.mkdir(parents=True, exist_ok=True)
    _sweep_stale_parts(folder)
    handle, partial = tempfile.mkstemp(dir=folder, prefix=f"{key}.", suffix=".part")
    try:
        with os.fdopen(handle, "wb") as out:
            status, headers = _within_deadline(url, out, timeout=timeout, max_bytes=max_bytes, headers=validators)
        if status != 304:
            os.replace(partial, body_path)
    finally:  # a refused, failed or interrupted download leaves no partial file behind
        Path(partial).unlink(missing_ok=True)
    if status == 304:  # not modified: the copy stands, and says when it was last confirmed
        # (meta is not None: a 304 answers the validators, which are sent only when there is a copy)
        meta = {**cast(dict[str, Any], meta), "revalidated_unix": time.time()}
    else:
        meta = {
            "url": url,
            "status": status,
            "etag": headers.get("etag"),
            "last_modified": headers.get("last-modified"),
            "fetched_unix": time.time(),
        }
    meta_path.write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return body_path


def _cached_meta(body_path: Path, meta_path: Path) -> dict | None:
    """What the cache recorded of a URL's copy, or None when there is no whole copy."""
    if not (body_path.exists() and meta_path.exists()):
        return None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _validators(meta: dict) -> dict[str, str]:
    """The conditional-request headers for a cached copy: its ETag and Last-Modified, as the server gave them."""
    headers = {}
    if isinstance(meta.get("etag"), str):
        headers["If-None-Match"] = meta["etag"]
    if isinstance(meta.get("last_modified"), str):
        headers["If-Modified-Since"] = meta["last_modified"]
    return headers


def _sweep_stale_parts(folder: Path) -> None:
    """Remove the partial files of downloads that were killed (SIGKILL runs no ``finally``)."""
    cutoff = time.time() - STALE_PART_S
    for path in folder.glob("*.part"):
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
        except FileNotFoundError:  # another process swept it first
            pass


def _within_deadline(
    url: str, out, *, timeout: float, max_bytes: int, headers: dict[str, str]
) -> tuple[int, httpx.Headers]:
    """Download on an event loop, where ``asyncio.timeout`` bounds the whole fetch: httpx's own time-out
    is per read, so a server sending a byte every few seconds would never trip it."""
    fetch = _stream_into(url, out, timeout=timeout, max_bytes=max_bytes, headers=headers)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(fetch)
    with ThreadPoolExecutor(
        1
    ) as pool:  # called from inside a running loop (a notebook): a loop of its own, on a thread
        return pool.submit(asyncio.run, fetch).result()


async def _stream_into(
    url: str, out, *, timeout: float, max_bytes: int, headers: dict[str, str]
) -> tuple[int, httpx.Headers]:
    try:
        async with (
            asyncio.timeout(timeout),
            httpx.AsyncClient(timeout=timeout, follow_redirects=True) as client,
            client.stream("GET", url, headers=headers) as response,
        ):
            if response.status_code == 304 and headers:
                return 304, response.headers
            if response.status_code >= 400:
                raise SourceError(f"{url}: HTTP {response.status_code} {response.reason_phrase}")
            announced = response.headers.get("content-length")
            if announced is not None and announced.isdigit() and int(announced) > max_bytes:
                raise SourceError(f"{url}: body of {announced} bytes exceeds the limit of {max_bytes} bytes")
            received = 0
            async for chunk in response.aiter_bytes():
                received += len(chunk)
                if received > max_bytes:
                    raise SourceError(f"{url}: body exceeds the limit of {max_bytes} bytes")
                out.write(chunk)
            return response.status_code, response.headers
    except (TimeoutError, httpx.TimeoutException):
        raise SourceError(
            f"{url}: timed out after {duration(timeout)} (the time-out covers the whole download)"
        ) from None
    except httpx.HTTPError as exc:
        raise SourceError(f"{url}: {type(exc).__name__}: {exc}") from None


def local_path(source: str | os.PathLike[str], **fetch_options) -> Path:
    """A local file for one source: the path itself, or an http(s) URL's copy in the cache.

    Raises ``FileNotFoundError`` or ``IsADirectoryError`` for a path that is missing or a folder.

    Parameters
    ----------
    source : str or os.PathLike
        A file path or an http(s) URL.
    **fetch_options
        Passed to ``fetch_url`` for a URL (``timeout``, ``max_bytes``, ``cache``, ``refresh``, ``offline``).

    Returns
    -------
    Path
    """
    if is_url(source):
        return fetch_url(str(source), **fetch_options)
    path = Path(source)
    if path.is_dir():
        raise IsADirectoryError(f"{source}: is a directory, not a file")
    if not path.exists():
        raise FileNotFoundError(f"{source}: no such file")
    return path


def read_source_bytes(source: str | os.PathLike[str], **fetch_options) -> bytes:
    """The bytes of one source (see :func:`local_path`).

    Parameters
    ----------
    source : str or os.PathLike
        A file path or an http(s) URL.
    **fetch_options
        Passed to ``fetch_url`` for a URL.

    Returns
    -------
    bytes
    """
    return local_path(source, **fetch_options).read_bytes()


def expand_sources(
    sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], *, suffix: str | tuple[str, ...] = ".json"
) -> list[str]:
    """Turn paths, folders, glob patterns and URLs into a list of single sources, in order.

    A folder contributes its files ending in ``suffix`` (one or a tuple; recursively, sorted); a pattern its sorted
    matches. A path that matches nothing is an error, never silently skipped.

    Parameters
    ----------
    sources : str, os.PathLike or iterable of them
        One source or several: files, folders, glob patterns (``**`` recurses) and http(s) URLs (kept as they are).
    suffix : str or tuple of str, default ".json"
        The endings of the files a folder contributes.

    Returns
    -------
    list of str
        The sources, each once; a repeat is left out with a ``SourceRepeated`` warning.

    Raises
    ------
    FileNotFoundError
        A path that does not exist, a folder without a matching file, or a pattern that matches nothing.

    Examples
    --------
    >>> expand_sources("data/aprender-lambda")[:2]  # doctest: +NORMALIZE_WHITESPACE
    ['data/aprender-lambda/marker@7e1b6e213b.json', 'data/aprender-lambda/marker@abb48c5cfa.json']
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    out: list[str] = []
    for source in sources:
        text = os.fspath(source)
        path = Path(text)
        if is_url(text):
            out.append(text)
        elif path.is_dir():
            suffixes = (suffix,) if isinstance(suffix, str) else suffix
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(suffixes))
            if not found:
                raise FileNotFoundError(f"{text}: directory holds no {' or '.join('*' + s for s in suffixes)} file")
            out.extend(str(p) for p in found)
        elif path.exists():
            out.append(text)
        elif glob.has_magic(text):
            matches = sorted(glob.glob(text, recursive=True))
            if not matches:
                raise FileNotFoundError(f"{text}: pattern matches no file")
            out.extend(matches)
        else:
            raise FileNotFoundError(f"{text}: no such file or directory")
    out, repeated = same_sources(out)
    for first, again in repeated:  # a file and its folder, or one file twice: read once, and said
        warnings.warn(f"{again} is {first} given again; it is read once", SourceRepeated, stacklevel=2)
    return out


class SourceRepeated(UserWarning):
    """The same file or URL was given more than once (say, a file and its folder); it is read once."""


def same_sources(sources: Iterable[str | os.PathLike[str]]) -> tuple[list[str], list[tuple[str, str]]]:
    """The sources with repeats left out (local paths compared where they really lead, URLs as written),
    and each repeat as (the source kept, the one left out).

    Parameters
    ----------
    sources : iterable of str or os.PathLike
        The sources, in order; the first of repeats is kept.

    Returns
    -------
    kept : list of str
        The sources without repeats, as written.
    repeated : list of (str, str)
        Each repeat as (the source kept, the one left out).

    Examples
    --------
    >>> same_sources(["data/aprender-lambda", "./data/aprender-lambda/", "https://h/w.json", "https://h/w.json"])
    (['data/aprender-lambda', 'https://h/w.json'], [('data/aprender-lambda', './data/aprender-lambda/'), ('https://h/w.json', 'https://h/w.json')])
    """
    kept: list[str] = []
    repeated: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for source in sources:
        text = os.fspath(source)
        key = text if is_url(text) else os.path.realpath(text)
        if key in seen:
            repeated.append((seen[key], text))
            continue
        seen[key] = text
        kept.append(text)
    return kept, repeated
