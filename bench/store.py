"""Store benchmark: bulk trajectory inserts and the audit queries, on a fresh SQLite file.

    python bench/store.py [--n 10000] [--batch 500] [--versions 100] [--url URL] [--strict]

Inserts N synthetic trajectories (8 turns, ~200 tokens each, packed arrays, tool calls) in
batches, spread over a chain of V harness versions, and prints rows/s; then times
"trajectories of one harness version" (decoded) and "lineage of the chain's tip" (recursive
CTE) and prints milliseconds (median of repeats). Targets: >= 5,000 rows/s, < 100 ms per
query. With --strict the exit status is 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coevo.assets.base import Asset  # noqa: E402
from coevo.store import Store  # noqa: E402
from coevo.trajectory import ToolCall, ToolResult, Trajectory, Turn  # noqa: E402

TARGET_ROWS_PER_S = 5000
TARGET_MS = 100.0


class BenchHarness(Asset):
    kind = "benchharness"
    system_prompt: str = ""


def synthetic(rng: random.Random, harness: str, i: int, turns: int = 8,
              tokens: int = 200) -> Trajectory:
    """An episode shaped like a multi-turn tool-calling rollout: a 40-token prompt, then per
    turn ~12 sampled tokens and ~8 observation tokens."""
    ids = [rng.randrange(49152) for _ in range(tokens)]
    mask = [0] * tokens
    lps = [0.0] * tokens
    spans, pos, step = [], 40, (tokens - 40) // turns
    for k in range(turns):
        start, end = pos, pos + step * 6 // 10
        for j in range(start, end):
            mask[j] = 1
            lps[j] = float(np.float32(-rng.random() * 3))
        spans.append(Turn(index=k, start=start, end=end, text=f"call {k}",
                          tool_calls=[ToolCall(name="lookup", arguments={"q": f"x{k}"})],
                          tool_results=[ToolResult(name="lookup", content=f"result {k}")],
                          seconds=0.05))
        pos += step
    messages = [{"role": "system", "content": "You are a tool-using agent."},
                {"role": "user", "content": f"task {i}"}]
    for k in range(turns):
        messages += [{"role": "assistant", "content": f"call {k}"},
                     {"role": "tool", "content": f"result {k}"}]
    return Trajectory(env="bench", task_id=f"t{i % 500}", group_id=f"g{i // 4}",
                      sample_index=i % 4, seed=i, messages=messages, token_ids=ids,
                      loss_mask=mask, logprobs=lps, prompt_len=40, turns=spans, outcome=1.0,
                      success=bool(i % 2), reward=0.5, criteria={"format": 1.0},
                      harness=harness, model="bench", timings={"generate": 0.4})


def median_ms(fn, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--versions", type=int, default=100)
    ap.add_argument("--url", help="database URL (default: a fresh SQLite file in a temp dir)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(args.url or str(Path(tmp) / "bench.db"))
        chain = [BenchHarness(name="h", system_prompt="v0")]
        for v in range(1, args.versions):
            chain.append(chain[-1].child(system_prompt=f"v{v}"))
        for h in chain:
            store.put_asset(h)
        run = store.create_run("bench")
        rng = random.Random(0)
        per = max(1, args.n // len(chain))
        trajs = [synthetic(rng, chain[min(i // per, len(chain) - 1)].hash, i)
                 for i in range(args.n)]
        n_tokens = sum(len(t.token_ids) for t in trajs) / len(trajs)

        t0, c0 = time.perf_counter(), time.process_time()
        for k in range(0, len(trajs), args.batch):
            store.add_trajectories(trajs[k:k + args.batch], run=run.id)
        insert_s = time.perf_counter() - t0
        # CPU seconds of this process: on a shared machine, wall time also counts the time
        # other processes held the cores (os.getloadavg is printed for that reason).
        insert_cpu = time.process_time() - c0
        rate = len(trajs) / insert_s

        mid = chain[len(chain) // 2].hash
        got = store.trajectories(harness=mid)
        assert len(got) == per and got[0].token_ids == trajs[per * (len(chain) // 2)].token_ids
        q_ms = median_ms(lambda: store.trajectories(harness=mid))
        anc = store.ancestors(chain[-1].hash)
        assert [r.hash for r in anc] == [h.hash for h in reversed(chain[:-1])]
        anc_ms = median_ms(lambda: store.ancestors(chain[-1].hash))
        desc_ms = median_ms(lambda: store.descendants(chain[0].hash))
        size = 0
        if not args.url:
            # Fold the WAL into the database file first: before that, the newest pages live in
            # bench.db-wal and the main file alone understates the store (2.6 vs 5.0 MB once).
            raw = store.engine.raw_connection()  # outside any transaction (autocommit)
            try:
                busy, _, _ = raw.cursor().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                assert busy == 0, "the WAL checkpoint could not complete"
            finally:
                raw.close()
            wal = Path(tmp, "bench.db-wal")
            size = Path(tmp, "bench.db").stat().st_size + (wal.stat().st_size if wal.exists() else 0)
        store.close()

    ok = rate >= TARGET_ROWS_PER_S and max(q_ms, anc_ms, desc_ms) < TARGET_MS
    print(f"insert: {len(trajs)} trajectories ({n_tokens:.0f} tokens, 8 turns each) in "
          f"batches of {args.batch}: {insert_s:.2f} s = {rate:,.0f} rows/s "
          f"(target >= {TARGET_ROWS_PER_S:,}: {rate / TARGET_ROWS_PER_S:.2f}x); "
          f"{len(trajs) / insert_cpu:,.0f} rows per CPU-second")
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cores, load average {load:.1f} (a loaded machine "
          "slows the wall-clock figures)")
    if size:
        print(f"database file after a WAL checkpoint: {size / 1e6:.1f} MB ({size / len(trajs) / 1e3:.2f} kB/trajectory)")
    print(f"trajectories of one harness version ({per} rows, decoded): {q_ms:.1f} ms")
    print(f"ancestors of a version in a chain of {len(chain)}: {anc_ms:.1f} ms")
    print(f"descendants of the chain's root: {desc_ms:.1f} ms  (target < {TARGET_MS:.0f} ms)")
    print("PASS" if ok else "FAIL")
    return 0 if ok or not args.strict else 1


if __name__ == "__main__":
    raise SystemExit(main())
