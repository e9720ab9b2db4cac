"""Per-task demos: which of the harness's demos a task is shown (`Harness.demo_selection`).

static: every demo of `demos`, in order. retrieve: DSPy's KNNFewShot with BM25 (coevo/agent/
bm25.py) in place of an embedding: the `k` demos of `demos` + `pool` whose messages are
lexically closest to the task's prompt and offered functions (the text skill activation ranks
by, `skill_query`), best first; ties keep the harness's order, so two gate arms with the same
harness see the same demos. Unlike skill activation, a demo that matches no query term can
still fill a slot: a worked example teaches the answer format whatever the topic.

Never retrieved: a demo whose `source` is the task being run (its own answer), or any task id
in `held_out` (the environment's val and test tasks, `held_out_ids`): the pool is built from
train trajectories, and this is the guard should a pool hold anything else. A demo without a
source (handwritten) cannot be checked and is kept.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from coevo.agent.bm25 import BM25
from coevo.agent.skills import skill_query
from coevo.assets.harness import Demo, Harness
from coevo.envs.base import Task

HELD_OUT_SPLITS = ("val", "test")


def held_out_ids(env: Any, harness: Harness) -> frozenset[str]:
    """The ids of the environment's val and test tasks when `harness` retrieves demos (a pool
    must never serve them), else nothing (static demos are chosen by a person or a proposer
    from train trajectories, and the lookup costs a pass over the splits)."""
    if harness.demo_selection.select != "retrieve":
        return frozenset()
    return frozenset(t.id for split in HELD_OUT_SPLITS for t in env.tasks(split))


def demo_text(demo: Demo) -> str:
    """What a demo is matched on: all its messages (the question and the worked answer, whose
    function names match a task's offered functions)."""
    return "\n".join(m.content for m in demo.messages)


def select_demos(harness: Harness, task: Task, held_out: Collection[str] = ()) -> list[Demo]:
    """The demos `task` is shown under `harness` (see the module docstring)."""
    sel = harness.demo_selection
    if sel.select == "static":
        return list(harness.demos)
    banned = {task.id, *held_out}
    pool = [d for d in harness.demo_candidates() if d.source is None or d.source not in banned]
    if not pool:
        return []
    scores = BM25([demo_text(d) for d in pool]).scores(skill_query(task.messages, task.tools))
    ranked = sorted(range(len(pool)), key=lambda i: (-scores[i], i))
    return [pool[i] for i in ranked[: sel.k]]
