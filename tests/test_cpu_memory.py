"""glibc's dynamic mmap threshold kept freed CPU tensors resident (coevo/models/cpu_memory.py):
a bench process grew to 11 GB, and to 22.7 GB (killed) beside other work. Each scenario runs
in a fresh interpreter, since the allocator's state is per process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coevo.models.cpu_memory import _glibc

pytestmark = pytest.mark.skipif(_glibc() is None or not Path("/proc/self/statm").exists(),
                                reason="glibc's allocator on Linux only")

TESTS = Path(__file__).resolve().parent

# What a sampling loop does to the heap: a large tensor freed (glibc raises its mmap threshold
# to that size), then a batch of tensors below that size, one more live tensor after them, and
# the batch freed. Prints the MiB still resident beyond the start.
SCENARIO = """
import json, sys
sys.path.insert(0, {tests!r})
import torch
from coevo.models.cpu_memory import resident_bytes
{setup}
base = resident_bytes()
big = torch.ones(6 << 20); del big              # 24 MiB, mmapped, then unmapped
blocks = [torch.ones(1 << 20) for _ in range(40)]  # 40 x 4 MiB
live = torch.ones(1 << 20)                        # allocated after them, kept
del blocks
print(json.dumps({{"retained_mib": (resident_bytes() - base) / 2**20}}))
"""


def retained(setup: str) -> float:
    code = SCENARIO.format(tests=str(TESTS), setup=setup)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}  # glibc's own
    env["PYTHONPATH"] = str(TESTS.parent)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["retained_mib"]


def test_the_scenario_keeps_freed_tensors_resident_under_glibcs_default():
    # The control: without coevo's setting the 160 MiB freed stay resident.
    assert retained("") > 120


def test_a_cpu_backend_returns_freed_tensors_to_the_system():
    # Building an HFBackend on CPU pins the threshold; the old code left it dynamic.
    setup = ("from test_agent import tiny_model_backend\n"
             "assert tiny_model_backend().device.type == 'cpu'")
    assert retained(setup) < 40


def test_the_users_own_threshold_is_left_alone(monkeypatch):
    from coevo.models import cpu_memory

    monkeypatch.setattr(cpu_memory, "_pinned", None)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert cpu_memory.pin_mmap_threshold() is None
    assert cpu_memory._pinned is None
