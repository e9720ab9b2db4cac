"""What a run executed on, stored with it (`runs.config["runtime"]`): the Python, torch and
transformers versions and torch's thread count. At a fixed thread count a run is repeatable
bit for bit (same seeds, same rows); with another thread count float reductions add up in
another order, so the weights after the first RL update differ in the last bits and sampled
rollouts diverge later. A reviewer reproducing a run needs these, not only the config.
Read without importing torch when the run's backends did not (backends that need no torch
do not load it)."""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from typing import Any


def runtime_info() -> dict[str, Any]:
    """{"python", "platform", "packages": {name: version}, "torch_threads"} (torch's thread
    count only when torch is loaded)."""
    pkgs = {}
    for name in ("coevo", "torch", "transformers", "peft"):
        try:
            pkgs[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    out: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "packages": pkgs}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch_threads"] = int(torch.get_num_threads())
    return out
