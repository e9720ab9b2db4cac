"""Model backends behind one contract (`coevo.models.base`); `load_backend(spec)` builds one.

Importing this package is cheap: each backend module imports its library (torch,
transformers, httpx, llama_cpp, vllm) only when used.
"""

from coevo.models.base import Backend, Completion, Request, Sampling, Tokenizer
from coevo.models.registry import BACKENDS, backend_kinds, load_backend

__all__ = [
    "BACKENDS",
    "Backend",
    "Completion",
    "Request",
    "Sampling",
    "Tokenizer",
    "backend_kinds",
    "load_backend",
]
