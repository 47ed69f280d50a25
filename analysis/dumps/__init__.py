"""Per-token logprob dumps from any engine, read into one schema (tokens, candidates, requests)."""

from ._read import FORMATS, Dump, ScannedDump, detect_format, read_dump, read_dumps, scan_dump
from ._schema import CANDIDATE_SCHEMA, REQUEST_SCHEMA, TOKEN_SCHEMA
from ._values import DumpError

__all__ = [
    "CANDIDATE_SCHEMA",
    "FORMATS",
    "REQUEST_SCHEMA",
    "TOKEN_SCHEMA",
    "Dump",
    "DumpError",
    "ScannedDump",
    "detect_format",
    "read_dump",
    "read_dumps",
    "scan_dump",
]
