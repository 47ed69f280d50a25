"""One module per dump format, each engine family's general parser with its columnar fast path beside it.

- ``_openai`` (+ ``_openai_fast``): chat and legacy completions, vLLM's generate; files of bare chat completions;
  ``_openai_tokens``: a choice's scored tokens in those shapes, which the stream parsers share too;
- ``_streams`` (+ ``_streams_fast``): the SSE streams of OpenAI, llama.cpp and SGLang; ``_responses``: the Responses API's;
- ``_native``: llama.cpp's, SGLang's, TGI's and prime-rl's own payloads; ``_offline``: vLLM's offline outputs;
- ``_torch``: ``torch.save`` files; ``_mlperf``: MLPerf accuracy logs;
- ``_capture`` (+ ``_capture_fast``): JSON lines of payloads, bare or in capture envelopes;
- ``_registry``: the formats' names, suffixes and detection (``FORMATS``, ``detect_format``).

What the reader (``dumps/_read``) and the layers above use is named here.
"""

from ._capture import parse_jsonl
from ._capture_fast import is_capture_jsonl, iter_capture_jsonl, read_capture_jsonl, read_jsonl
from ._mlperf import MlperfLog, read_mlperf_log
from ._openai_fast import read_chat_jsonl
from ._registry import (
    DUMP_SUFFIXES,
    FORMATS,
    PAYLOAD_PARSERS,
    STREAM_FORMATS,
    detect_format,
    parse_payload_text,
    utf8_text,
)
from ._torch import parse_torch

__all__ = [
    "DUMP_SUFFIXES",
    "FORMATS",
    "PAYLOAD_PARSERS",
    "STREAM_FORMATS",
    "MlperfLog",
    "detect_format",
    "is_capture_jsonl",
    "iter_capture_jsonl",
    "parse_jsonl",
    "parse_payload_text",
    "parse_torch",
    "read_capture_jsonl",
    "read_chat_jsonl",
    "read_jsonl",
    "read_mlperf_log",
    "utf8_text",
]
