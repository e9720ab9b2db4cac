"""The `demos` proposer: bootstrapped few-shot demonstrations, no LLM (DSPy's
BootstrapFewShot idea applied to transcripts the policy itself produced).

From the round's SUCCESSFUL train trajectories it picks `k` demos by reward (then outcome),
one per task first and spread over task families (round-robin by family, so the demos do not
all teach one kind of task), and returns a harness child whose `demos` are those transcripts.
A transcript is the trajectory's messages minus what the harness put there (the system message
and the harness's own demos, known from `ctx.harnesses`), cut after the final assistant turn.

Departures from DSPy: no teacher program and no metric calls of its own (the environment's
verifier already scored the trajectory); `keep` existing demos can be kept ahead of the new
ones; ties are broken by trajectory id so the choice is reproducible (resume re-derives it).

`select: retrieve` proposes DSPy's KNNFewShot instead: a harness child whose
`demo_selection` retrieves the `k` closest demos per task (coevo/agent/demos.py) from a pool
of the round's successful train trajectories (best one per task, up to `pool_size`), merged
with the incumbent's pool when it already retrieves (a task's new demo replaces its old one;
the newest round's demos come first, so a full pool drops the oldest). The static `demos` are
kept: they stay retrieval candidates.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from coevo.assets.harness import POOL_MAX, Demo, DemoMessage, DemoSelection, Harness
from coevo.propose.base import PROPOSERS, Candidate, ProposalContext
from coevo.propose.digest import episode_messages
from coevo.trajectory import Trajectory

_MAX_DEMOS = 16  # Harness.demos max_length
_ROLES = {"user", "assistant", "tool"}


class DemosProposer:
    name = "demos"

    def __init__(self, k: int = 2, keep: int = 0, min_reward: float | None = None,
                 max_chars: int = 4000, name: str = "demos", select: str = "static",
                 pool_size: int = 64):
        if k < 1:
            raise ValueError("k must be >= 1")
        if keep < 0 or keep + k > _MAX_DEMOS:
            raise ValueError(f"keep + k must be within 0..{_MAX_DEMOS}")
        if select not in ("static", "retrieve"):
            raise ValueError(f"select {select!r}; expected static or retrieve")
        if not 1 <= pool_size <= POOL_MAX:
            raise ValueError(f"pool_size must be within 1..{POOL_MAX}")
        self.k, self.keep, self.min_reward = k, keep, min_reward
        self.max_chars, self.name = max_chars, name
        self.select, self.pool_size = select, pool_size

    def propose(self, ctx: ProposalContext) -> list[Candidate]:
        if self.select == "retrieve":
            return self.propose_pool(ctx)
        harness = ctx.incumbent.harness
        picked = select(eligible(ctx.trajectories, self.min_reward), self.k)
        demos = [d for d in (to_demo(t, ctx.harnesses.get(t.harness or ""), self.max_chars)
                                for t in picked) if d]
        if not demos:
            return []  # nothing successful to learn from this round: no candidate, not invalid
        new = list(harness.demos[: self.keep]) + demos
        if new == list(harness.demos):
            return []
        asset = harness.child(demos=new)
        tasks = ", ".join(d.source or "?" for d in demos)
        return [Candidate(
            asset=asset, proposer=self.name, kind="harness",
            rationale=f"bootstrapped {len(demos)} demo(s) from successful train trajectories "
                      f"of round {ctx.round} (tasks: {tasks}), keeping {self.keep} existing",
            predicted_effect="better format adherence and task success from worked examples "
                             "the policy itself produced")]

    def propose_pool(self, ctx: ProposalContext) -> list[Candidate]:
        """A harness child retrieving `k` demos per task from a pool of this round's
        successful train trajectories (merged with the incumbent's pool)."""
        harness = ctx.incumbent.harness
        picked = select(eligible(ctx.trajectories, self.min_reward), self.pool_size)
        new = [d for d in (to_demo(t, ctx.harnesses.get(t.harness or ""), self.max_chars)
                           for t in picked) if d]
        if not new:
            return []
        old = harness.demo_selection.pool if harness.demo_selection.select == "retrieve" else []
        fresh = {d.source for d in new}
        pool = (new + [d for d in old if d.source not in fresh])[: self.pool_size]
        selection = DemoSelection(select="retrieve", k=self.k, pool=pool)
        if selection == harness.demo_selection:
            return []
        return [Candidate(
            asset=harness.child(demo_selection=selection), proposer=self.name, kind="harness",
            rationale=f"retrieve {self.k} demo(s) per task (BM25) from a pool of {len(pool)}: "
                      f"{len(new)} from successful train trajectories of round {ctx.round}"
                      + (f", {len(pool) - len(new)} kept from the incumbent's pool" if old else ""),
            predicted_effect="worked examples close to each task (same functions, same kind of "
                             "question) teach the format and the content better than fixed ones")]

def eligible(trajs: Sequence[Trajectory], min_reward: float | None = None) -> list[Trajectory]:
    """The successful train trajectories a demo may come from (reward >= min_reward if set)."""
    out = []
    for t in trajs:
        if t.split != "train" or t.infra_failed or not t.success:
            continue
        if min_reward is not None and (t.reward is None or t.reward < min_reward):
            continue
        out.append(t)
    return out


def select(trajs: list[Trajectory], k: int) -> list[Trajectory]:
    """Best trajectory per task (reward, then outcome, then id), then round-robin over task
    families (task id prefix before the last '-' / ':' stands in when no family is known) in
    order of each family's best, so k demos cover as many families as possible."""
    def key(t: Trajectory) -> tuple:
        return (-(t.reward if t.reward is not None else -1.0),
                -(t.outcome if t.outcome is not None else -1.0), t.id)

    best: dict[str, Trajectory] = {}
    for t in sorted(trajs, key=key):
        best.setdefault(t.task_id, t)
    families: OrderedDict[str, list[Trajectory]] = OrderedDict()
    for t in sorted(best.values(), key=key):
        families.setdefault(_family(t.task_id), []).append(t)
    out: list[Trajectory] = []
    while len(out) < k and any(families.values()):
        for group in families.values():
            if group and len(out) < k:
                out.append(group.pop(0))
    return out


def _family(task_id: str) -> str:
    for sep in (":", "-", "_"):
        if sep in task_id:
            return task_id.rsplit(sep, 1)[0]
    return task_id


def to_demo(t: Trajectory, harness: Harness | None, max_chars: int = 4000) -> Demo | None:
    """The task part of a transcript as a Demo (None if it has no user -> assistant shape)."""
    msgs = episode_messages(t, harness)
    while msgs and msgs[-1].get("role") != "assistant":
        msgs.pop()  # a trailing observation or reflection prompt teaches nothing
    out = []
    for m in msgs:
        role, content = m.get("role"), m.get("content")
        if role not in _ROLES or not isinstance(content, str) or not content.strip():
            continue
        out.append(DemoMessage(role=role, content=content[:max_chars],
                               name=m.get("name") if role == "tool" else None))
    if len(out) < 2 or out[0].role != "user" or out[-1].role != "assistant" or len(out) > 16:
        return None
    return Demo(messages=out, source=t.task_id)


PROPOSERS.add("demos", DemosProposer)
