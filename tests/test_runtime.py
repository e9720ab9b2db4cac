"""A run stores what it executed on (coevo/runtime.py): versions and torch's thread count,
the facts besides the config that decide whether a rerun repeats it bit for bit."""

from __future__ import annotations

import platform

import torch
from test_loop import NO_EFFECT, _run


def test_run_record_carries_versions_and_torch_threads(tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _, store, _, res = _run(tmp_path, "harness-only", (NO_EFFECT,))
    finally:
        torch.set_num_threads(before)
    rt = store.get_run(res.run).config["runtime"]
    assert rt["torch_threads"] == 1 and rt["python"] == platform.python_version()
    assert rt["packages"]["torch"] in (torch.__version__, torch.__version__.split("+")[0])
    assert set(rt["packages"]) >= {"coevo", "torch", "transformers"}
