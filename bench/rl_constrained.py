"""A short RL stage under the constrained harness on BFCL simple_python: val before and after.

The embedded SmolLM2-135M under `function_calling_constrained` (and its rubric: outcome plus
right-name and argument-value credit) is evaluated on the val split (greedy, and one seeded
sample per task at the harness's sampling settings), trained for `--steps` GRPO steps
(LoRA, G samples per task, tasks from the train split) with the live policy rolling out
under the grammar, then evaluated again on the same tasks with the same seeds. Printed: accuracy
before / after with Wilson intervals, the paired difference with a 95% paired-bootstrap
interval over tasks, per-step reward / signal fraction / PPO ratio, and seconds. Results go
to bench/data/rl_constrained.json.

    python bench/rl_constrained.py [--steps 30] [--tasks-per-step 4] [--group 4] [--lr 1e-4]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bfcl_harnesses import wilson  # noqa: E402


def paired_bootstrap(before: list[float], after: list[float], reps: int = 10_000,
                     seed: int = 0) -> tuple[float, float, float]:
    """Mean of after - before over tasks and its 95% percentile bootstrap interval."""
    d = [a - b for a, b in zip(after, before)]
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(d) for _ in d) / len(d) for _ in range(reps))
    return sum(d) / len(d), means[int(0.025 * reps)], means[int(0.975 * reps) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--tasks-per-step", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--n", type=int, default=None, help="val tasks (default: all)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "data" / "rl_constrained.json"))
    args = ap.parse_args()

    import torch

    from coevo.agent.episode import run_episodes_sync
    from coevo.assets.io import load_asset
    from coevo.envs.bfcl import BFCLEnv
    from coevo.executors import AgentAssets
    from coevo.models.embedded import load_embedded
    from coevo.rl.config import TrainConfig
    from coevo.rl.stage import StageConfig, live_policy, rl_stage
    from coevo.rl.trainer import Trainer
    from coevo.store import Store

    torch.manual_seed(0)
    harness = load_asset(ROOT / "harnesses" / "function_calling_constrained.yaml")
    rubric = load_asset(ROOT / "rubrics" / "function_calling_constrained.yaml")
    env = BFCLEnv("simple_python")
    val = env.tasks("val", args.n)
    base = load_embedded()
    trainer = Trainer(base.model, TrainConfig(lr=args.lr), base_model="embedded",
                      tokenizer=base.tokenizer)
    policy = live_policy(trainer, base.tokenizer)
    greedy = harness.model_copy(update={"decoding": harness.decoding.model_copy(
        update={"temperature": 0.0})})

    def evaluate() -> dict[str, list[float]]:
        out = {}
        for name, h in (("greedy", greedy), ("sampled", harness)):
            trajs = run_episodes_sync(env, val, h, rubric=rubric, backend=policy, samples=1,
                                      seeds=7, split="val")
            out[name] = [t.outcome if t.outcome is not None else 0.0 for t in trajs]
        return out

    t0 = time.perf_counter()
    before = evaluate()
    t_eval = time.perf_counter() - t0
    print({k: f"{sum(v)}/{len(v)}" for k, v in before.items()}, f"({t_eval:.0f} s)", flush=True)

    store = Store.open(f"sqlite:///{tempfile.mkdtemp()}/rl.db")
    run = store.create_run("rl-constrained", config={"steps": args.steps}, mode="weight-only")
    store.start_round(run.id, 0)
    cfg = StageConfig(steps=args.steps, tasks_per_step=args.tasks_per_step, samples=args.group,
                      seed=0, checkpoint_every=args.steps,
                      checkpoint_dir=tempfile.mkdtemp(prefix="rl-ckpt-"))
    steps = []

    def on_step(log) -> None:
        steps.append(log.model_dump(mode="json"))
        print(f"step {log.step}: reward {log.reward_mean:.3f} signal {log.signal_fraction:.2f} "
              f"loss {log.loss:+.4f} ({log.seconds_rollout:.0f}+{log.seconds_train:.0f} s)",
              flush=True)

    t1 = time.perf_counter()
    stats = []
    orig_step = trainer.step

    def step_and_keep(trajs):  # the PPO ratio of each update, for the consistency figure
        s = orig_step(trajs)
        stats.append({"ratio_mean": s.ratio_mean, "clip_fraction": s.clip_fraction})
        return s

    trainer.step = step_and_keep  # type: ignore[method-assign]
    rl_stage(store, run.id, 0, env, AgentAssets(harness=harness, rubric=rubric), trainer, cfg,
             tokenizer=base.tokenizer, backend=policy, on_step=on_step)
    t_train = time.perf_counter() - t1
    after = evaluate()

    result = {"steps": steps, "updates": stats, "before": before, "after": after,
              "seconds": {"eval": t_eval, "train": t_train}, "args": vars(args)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\nval n={len(val)}, {args.steps} steps x {args.tasks_per_step} tasks x G={args.group}, "
          f"lr {args.lr}, train {t_train / 60:.1f} min")
    for k in ("greedy", "sampled"):
        b, a = before[k], after[k]
        lb, hb = wilson(int(sum(b)), len(b))
        la, ha = wilson(int(sum(a)), len(a))
        m, lo, hi = paired_bootstrap(b, a)
        print(f"{k}: before {sum(b) / len(b):.3f} [{lb:.3f}, {hb:.3f}] -> after "
              f"{sum(a) / len(a):.3f} [{la:.3f}, {ha:.3f}]; paired diff {m:+.3f} "
              f"[{lo:+.3f}, {hi:+.3f}]")
    # A step whose groups all had equal rewards trains nothing (no ratio to report).
    ratios = [u["ratio_mean"] for u, st in zip(stats, steps) if st.get("updated", True)]
    if ratios:
        print(f"PPO ratio at the {len(ratios)} updates ({len(stats) - len(ratios)} steps without "
              f"signal left out): mean {sum(ratios) / len(ratios):.6f}, max |ratio-1| "
              f"{max(abs(r - 1) for r in ratios):.2e}")


if __name__ == "__main__":
    main()
