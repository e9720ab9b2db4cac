"""Resident memory of repeated CPU evaluations, with glibc's mmap threshold pinned (what an
HFBackend on CPU does, coevo/models/cpu_memory.py) and left dynamic (glibc's default), printed
as ratios.

Each arm is a fresh process that runs the same evaluation `--reps` times: `--tasks` episodes of
BFCL simple_python val on the embedded model, with the constrained harness and copied strings,
one seeded sample per task (the same seeds in both arms, so both decode the same tokens up to
float rounding). After each evaluation it records the seconds taken, the resident set size and
the peak (VmHWM).

    python bench/cpu_memory.py [--tasks 72] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ARM = """
import json, re, sys, time
sys.path[:0] = [{root!r}, {bench!r}]
import coevo.models.hf as hf
if {dynamic}:
    hf.pin_mmap_threshold = lambda: None  # glibc's default: the threshold follows frees
from bfcl_harnesses import load_harness
from coevo.agent.episode import run_episodes_sync
from coevo.envs.registry import make_env
from coevo.models.embedded import load_embedded

def status(key):
    text = open("/proc/self/status").read()
    return int(re.search(key + r":\\s+(\\d+)", text).group(1)) * 1024 / 1e9

env = make_env("bfcl:simple_python")
h = load_harness("function_calling_constrained:copy")
backend = load_embedded()
tasks = env.tasks("val")[:{tasks}]
for rep in range({reps}):
    t = time.perf_counter()
    trajs = run_episodes_sync(env, tasks, h, backend=backend, seeds=rep)
    print(json.dumps(dict(rep=rep, seconds=time.perf_counter() - t, rss=status("VmRSS"),
                          peak=status("VmHWM"),
                          mean=sum(x.reward for x in trajs) / len(trajs))), flush=True)
"""


def arm(dynamic: bool, tasks: int, reps: int) -> list[dict]:
    code = ARM.format(root=str(ROOT), bench=str(ROOT / "bench"), dynamic=dynamic, tasks=tasks,
                      reps=reps)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"arm {'dynamic' if dynamic else 'pinned'} failed:\n{out.stderr[-3000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=72)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if not Path("/proc/self/status").exists():
        raise SystemExit("needs Linux /proc")
    res = {"dynamic": arm(True, args.tasks, args.reps), "pinned": arm(False, args.tasks, args.reps)}
    print(f"{args.tasks} BFCL simple_python val episodes per evaluation, embedded model, "
          f"{args.reps} evaluations per process")
    print(f"{'arm':8} {'eval':>4} {'seconds':>8} {'RSS GB':>7} {'peak GB':>8} {'mean':>6}")
    for name, rows in res.items():
        for r in rows:
            print(f"{name:8} {r['rep']:>4} {r['seconds']:>8.1f} {r['rss']:>7.2f} "
                  f"{r['peak']:>8.2f} {r['mean']:>6.3f}")
    d, p = res["dynamic"], res["pinned"]
    print(f"RSS after the last evaluation, pinned / dynamic: {p[-1]['rss'] / d[-1]['rss']:.2f}")
    print(f"peak, pinned / dynamic: {p[-1]['peak'] / d[-1]['peak']:.2f}")
    print(f"seconds, pinned / dynamic: "
          f"{sum(r['seconds'] for r in p) / sum(r['seconds'] for r in d):.2f}")


if __name__ == "__main__":
    main()
