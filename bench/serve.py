"""Reviewer web app benchmark: page latency of `coevo serve` on a large store.

    python bench/serve.py [--trajectories 100000] [--proposals 1000] [--requests 20]
                          [--db PATH] [--strict]

Builds (or, with --db pointing at an existing file built before, reuses) a SQLite store shaped
like a long gated run, through the store's own API: 2 runs of rounds with 10 proposals each
(one invalid; every round accepts one), a harness version per proposal whose system prompt
grows a line per accepted round (so blame walks a long lineage and lineage draws ~1,000
versions), per round an incumbent arm and a candidate arm per valid proposal over 50 val
tasks (evaluations, results, evidence, trajectories of 8 turns and ~200 tokens, as
bench/store.py makes them) and RL train trajectories filling the rest of the trajectory
count. Then it serves the app over the store opened read-only (uvicorn on 127.0.0.1, a free
port), requests every page `--requests` times with ids drawn at random, and prints p50 / p95 /
max milliseconds per page. Target: p95 < 1,000 ms for every page; with --strict the exit
status is 1 when one misses it.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coevo.assets.harness import Harness  # noqa: E402
from coevo.store import Store  # noqa: E402
from coevo.trajectory import ToolCall, ToolResult, Trajectory, Turn  # noqa: E402

TARGET_MS = 1000.0
VAL_TASKS = 50
PER_ROUND = 10  # proposals per round; the last one of each round is invalid


def _template(rng: random.Random, tokens: int = 200, turns: int = 8) -> dict[str, Any]:
    """Token arrays, turns and messages shared by every synthetic episode (pydantic keeps the
    same objects, so building 100,000 episodes costs little beyond the insert)."""
    ids = [rng.randrange(49152) for _ in range(tokens)]
    mask, lps = [0] * tokens, [0.0] * tokens
    spans, pos, step = [], 40, (tokens - 40) // turns
    for k in range(turns):
        for j in range(pos, pos + step * 6 // 10):
            mask[j], lps[j] = 1, -0.5
        spans.append(Turn(index=k, start=pos, end=pos + step * 6 // 10, text=f"call {k}",
                          tool_calls=[ToolCall(name="lookup", arguments={"q": f"x{k}"})],
                          tool_results=[ToolResult(name="lookup", content=f"result {k}")],
                          seconds=0.05))
        pos += step
    messages = [{"role": "system", "content": "You are a tool-using agent."},
                {"role": "user", "content": "task"}]
    for k in range(turns):
        messages += [{"role": "assistant", "content": f"call {k}"},
                     {"role": "tool", "content": f"result {k}"}]
    return {"token_ids": ids, "loss_mask": mask, "logprobs": lps, "turns": spans,
            "messages": messages, "prompt_len": 40}


def _episode(tpl: dict[str, Any], task: str, split: str, outcome: float, harness: str,
             seed: int) -> Trajectory:
    return Trajectory(env="bench", task_id=task, split=split, seed=seed, outcome=outcome,
                      success=outcome > 0.5, reward=outcome + 0.5, criteria={"format": 0.5},
                      harness=harness, model="bench", timings={"generate": 0.4}, **tpl)


def build(path: Path | str, trajectories: int, proposals: int, seed: int = 0) -> dict[str, Any]:
    """Write the synthetic store (module docstring) at a path or database URL; returns ids to
    request pages with."""
    rng = random.Random(seed)
    tpl = _template(rng)
    store = Store.open(str(path))
    rounds_total = max(1, proposals // PER_ROUND)
    runs = 2 if rounds_total >= 2 else 1
    val_per_round = VAL_TASKS * PER_ROUND  # incumbent arm + 9 candidate arms
    train = max(0, trajectories // rounds_total - val_per_round)
    base = Harness.model_validate({"name": "bench", "system_prompt": "You are a careful agent.",
                                   "workflow": {"max_turns": 8}})
    store.put_asset(base)
    out: dict[str, Any] = {"runs": [], "proposals": [], "rounds": [], "tips": [], "root": base.hash,
                           "pairs": [], "trajectories": []}
    tasks = [f"bench@0:{i}" for i in range(VAL_TASKS)]
    for r_i in range(runs):
        n_rounds = rounds_total // runs + (r_i < rounds_total % runs)
        run = store.create_run(f"bench-{r_i}", mode="gated", status="done", config={
            "config": {"env": "bench", "gate": {"name": "paired", "screen_size": 20,
                                                "chunk_size": 10}},
            "seed": {"harness": base.hash, "skill_library": None, "rubric": None}})
        out["runs"].append(run.id)
        inc, score = base, 0.3
        for k in range(n_rounds):
            with store.transaction():
                _round(store, rng, tpl, run.id, k, inc, score, tasks, train, out)
            acc = out["accepted"]
            inc, score = acc, min(0.95, score + 0.01)
        out["tips"].append(inc.hash)
    store.close()
    return out


def _round(store: Store, rng: random.Random, tpl: dict[str, Any], run: str, k: int,
           inc: Harness, score: float, tasks: list[str], train: int, out: dict[str, Any]) -> None:
    store.start_round(run, k)
    out["rounds"].append((run, k))
    trajs = [_episode(tpl, f"bench@1:{rng.randrange(5000)}", "train", float(rng.random() < score),
                      inc.hash, i) for i in range(train)]
    if trajs:
        store.add_trajectories(trajs, run=run, round=k)
    inc_out = {t: float(rng.random() < score) for t in tasks}
    inc_ids = _arm(store, tpl, run, k, inc.hash, inc_out)
    out["trajectories"].extend(inc_ids[:2])
    accepted = None
    for j in range(PER_ROUND):
        if j == PER_ROUND - 1:
            store.add_proposal(proposer="harness", kind="harness", parent=inc.hash, candidate=None,
                               run=run, round=k, status="invalid", rationale=f"rule {k}.{j}",
                               raw_output="{not json", error="parse error: expected a JSON object",
                               prompt="Revise the harness.\n" * 40)
            continue
        cand = inc.child(system_prompt=f"{inc.system_prompt}\nRule {k}.{j}: check the answer "
                                       f"before replying ({rng.randrange(10**6)}).")
        good = j == 0
        # The round's first candidate fixes some of the incumbent's failures; the others are noise.
        cand_out = {t: max(v, float(rng.random() < 0.4)) if good else float(rng.random() < score)
                    for t, v in inc_out.items()}
        pid = store.add_proposal(proposer="harness" if j % 2 == 0 else "gepa", kind="harness",
                                 parent=inc.hash, candidate=cand, run=run, round=k,
                                 status="pending", rationale=f"rule {k}.{j}: checking answers helps",
                                 predicted_effect="+2pp", prompt="Revise the harness.\n" * 40,
                                 raw_output=cand.system_prompt, model="bench-lm")
        _arm(store, tpl, run, k, cand.hash, cand_out)
        diffs = [cand_out[t] - inc_out[t] for t in tasks]
        w, lo = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
        store.add_decision(pid, policy="paired", accepted=good, rollouts=2 * len(tasks),
                           reason=f"{'accepted' if good else 'rejected'}: wins {w}, losses {lo}",
                           statistic={"mean_diff": sum(diffs) / len(diffs), "wins": w, "losses": lo,
                                      "ties": len(tasks) - w - lo, "n": len(tasks),
                                      "p_value": 0.01 if good else 0.5,
                                      "p_adjusted": 0.02 if good else 0.9, "ci_low_bound": 0.0},
                           evidence=[{"task_id": t, "incumbent": inc_out[t],
                                      "candidate": cand_out[t]} for t in tasks])
        out["proposals"].append(pid)
        out["pairs"].append((pid, tasks[rng.randrange(len(tasks))]))
        if good:
            accepted = cand
    out["accepted"] = accepted
    for kind, amount in (("rollouts", train + VAL_TASKS * PER_ROUND), ("tokens", 9000.0),
                         ("proposer_calls", 2.0), ("seconds", 60.0)):
        store.add_budget(run, kind, amount, round=k)
    summary = {"val_score": score + 0.01, "val_ci": [score - 0.1, score + 0.1],
               "incumbent": {"harness": accepted.hash, "skill_library": None, "rubric": None},
               "accepted": [accepted.hash], "rl_steps": [
                   {"step": 4 * k + s, "reward_mean": score, "signal_fraction": 0.5, "kl": 0.01,
                    "loss": 0.1, "rollouts": train // 4} for s in range(4)]}
    if k == 0:
        summary.update(val_start_score=score, val_start_ci=[score - 0.1, score + 0.1])
    store.finish_round(run, k, "done", summary=summary)


def _arm(store: Store, tpl: dict[str, Any], run: str, k: int, harness: str,
         outcomes: dict[str, float]) -> list[str]:
    ev = store.create_evaluation(split="val", env="bench", run=run, round=k, harness=harness)
    trajs = [_episode(tpl, t, "val", o, harness, 1000 + k) for t, o in outcomes.items()]
    ids = store.add_trajectories(trajs, run=run, round=k, evaluation=ev)
    store.add_results(ev, [{"task_id": t.task_id, "outcome": t.outcome, "success": t.success,
                            "reward": t.reward, "trajectory": i} for t, i in zip(trajs, ids)])
    return ids


def pages(ids: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Page name -> a function giving a path to request (a fresh random id each call)."""
    def pick(xs: list[Any]) -> Any:
        return xs[rng.randrange(len(xs))]

    def pair() -> str:
        pid, task = pick(ids["pairs"])
        return f"/proposals/{pid}/pair?task={task}&sample=0"

    deep = max(1, len(ids["proposals"]) // len(ids["runs"]) // 50)  # a late page of a run
    rejected_page = max(1, min(5, len(ids["proposals"]) * 7 // 8 // 50))
    return {
        "runs": lambda: "/",
        "run": lambda: f"/runs/{pick(ids['runs'])}",
        f"run, proposals page {deep}": lambda: f"/runs/{pick(ids['runs'])}?page={deep}",
        "compare 2 runs": lambda: "/compare?" + "&".join(f"run={r}" for r in ids["runs"]),
        "round": lambda: "/runs/{}/rounds/{}".format(*pick(ids["rounds"])),
        "proposal": lambda: f"/proposals/{pick(ids['proposals'])}",
        "proposal, lost only": lambda: f"/proposals/{pick(ids['proposals'])}?show=lost",
        "both arms of a task": pair,
        "trajectory": lambda: f"/trajectories/{pick(ids['trajectories'])}",
        "blame of a tip": lambda: f"/versions/{pick(ids['tips'])}/blame",
        "lineage (whole tree)": lambda: f"/versions/{ids['root']}/lineage",
        "search text": lambda: f"/proposals?q=rule+{rng.randrange(50)}.",
        f"search rejected, page {rejected_page}":
            lambda: f"/proposals?status=rejected&page={rejected_page}",
        "assets": lambda: "/assets",
    }


def serve_in_thread(db: str) -> tuple[str, Any]:
    import uvicorn

    from coevo.serve.app import create_app
    from coevo.store.queries import open_readonly

    store = open_readonly(db)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(store), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trajectories", type=int, default=100_000)
    ap.add_argument("--proposals", type=int, default=1_000)
    ap.add_argument("--requests", type=int, default=20, help="requests per page")
    ap.add_argument("--db", help="SQLite file to build (kept) or reuse; default: a temp file")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a page misses the target")
    args = ap.parse_args()
    import httpx

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.db) if args.db else Path(tmp) / "serve.db"
        ids_file = path.with_suffix(".ids.json")
        if path.exists() and ids_file.exists():
            import json
            ids = json.loads(ids_file.read_text())
            print(f"reusing {path}")
        else:
            t0 = time.perf_counter()
            ids = build(path, args.trajectories, args.proposals)
            ids.pop("accepted", None)
            if args.db:
                import json
                ids_file.write_text(json.dumps(ids))
            print(f"built {path} in {time.perf_counter() - t0:.0f} s")
        size = path.stat().st_size
        url, server = serve_in_thread(str(path))
        rng = random.Random(1)
        worst = 0.0
        print(f"store: {size / 1e6:.0f} MB, {len(ids['runs'])} runs, {len(ids['rounds'])} rounds; "
              f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (a loaded "
              "machine slows every figure)")
        print(f"{'page':28} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}  bytes")
        with httpx.Client(base_url=url, timeout=60) as client:
            for name, path_of in pages(ids, rng).items():
                client.get(path_of())  # warm the page's code path once
                times, size_b = [], 0
                for _ in range(args.requests):
                    p = path_of()
                    t = time.perf_counter()
                    resp = client.get(p)
                    times.append((time.perf_counter() - t) * 1000)
                    if resp.status_code != 200:
                        print(f"{name}: {p} answered {resp.status_code}")
                        return 1
                    size_b = max(size_b, len(resp.content))
                times.sort()
                p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
                worst = max(worst, p95)
                print(f"{name:28} {statistics.median(times):8.0f} {p95:8.0f} {times[-1]:8.0f}  {size_b:,}")
        server.should_exit = True
    ok = worst < TARGET_MS
    print(f"slowest p95 {worst:.0f} ms (target < {TARGET_MS:.0f} ms): {'PASS' if ok else 'FAIL'}")
    return 0 if ok or not args.strict else 1


if __name__ == "__main__":
    raise SystemExit(main())
