"""Per-token logprob dumps from any engine, read into one schema (tokens, candidates, requests).

``__all__`` is the public reading API (documented as ``analysis.dumps``). The layers above (run, probe, studies, report)
take the few internals they share from here too, below it: never from a private module of this folder.
"""

from ._read import Dump, ScannedDump, read_dump, read_dumps, scan_dump
from ._schema import CANDIDATE_SCHEMA, REQUEST_SCHEMA, TOKEN_SCHEMA
from ._values import DumpError
from .formats import DUMP_SUFFIXES, FORMATS, detect_format

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

# For the layers above, not in __all__ (so not in the API reference; ``X as X`` marks each as re-exported): the probe
# checks each capture as it lands (parse_source, parse_sse, LIVE_SPAN), analysis.read_mlperf_pair pairs two logs
# (MlperfLog, read_mlperf_log), run/ reads captures a piece at a time (iter_dump_parts, StreamRefused) and writes captures in the formats it re-reads (PAYLOAD_PARSERS, STREAM_FORMATS),
# studies/ conforms its frames to the schema (conform).
from ._liveness import LIVE_SPAN as LIVE_SPAN
from ._read import StreamRefused as StreamRefused
from ._read import iter_dump_parts as iter_dump_parts
from ._read import parse_source as parse_source
from ._schema import conform as conform
from ._sse import parse_sse as parse_sse
from .formats import PAYLOAD_PARSERS as PAYLOAD_PARSERS
from .formats import STREAM_FORMATS as STREAM_FORMATS
from .formats import MlperfLog as MlperfLog
from .formats import read_mlperf_log as read_mlperf_log
