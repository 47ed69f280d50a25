"""Per-token logprob dumps from any engine, read into one schema (tokens, candidates, requests)."""

from ._formats import DUMP_SUFFIXES, FORMATS, detect_format
from ._read import Dump, ScannedDump, read_dump, read_dumps, scan_dump
from ._read import parse_source  # for the probe, which checks each capture as it lands; not in __all__
from ._mlperf import MlperfLog, read_mlperf_log  # for analysis.read_mlperf_pair, which pairs two logs; not in __all__
from ._schema import CANDIDATE_SCHEMA, REQUEST_SCHEMA, TOKEN_SCHEMA
from ._values import DumpError

__all__ = [
    "CANDIDATE_SCHEMA",
    "DUMP_SUFFIXES",
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
