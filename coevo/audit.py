"""Audit views: what a run did and why, read back from the store.

Two layers. Plain-data extractors (`round_rows`, `budget_rows`, `rl_steps`, `proposal_rows`)
turn stored rows into small pydantic records; the rich views (`runs_table`, `run_view`,
`proposals_table`, `proposal_view`, `lineage_tree`) and the HTML report (coevo/report.py) both
render those records, so the terminal and the report never disagree about a number. Every
string that a model or a user wrote goes through coevo.terminal (`plain`, `safe`): shown as
written, never interpreted as a terminal sequence or rich markup.

What is read from where. The store records everything as rows except what only the loop knows
per round; that comes from the round summary (`store.finish_round(..., summary=...)`). Every key
is optional, and a missing key shows as "-" (or "no data" in a plot), never as 0:

    summary["val_score"]    float  incumbent's validation score at the end of the round
    summary["test_score"]   float  the final test score (the test split is used once, so
                                   normally only the last round has it)
    summary["evaluations"]  {"val": evaluation id, "test": evaluation id}; used when the
                            matching *_score key is absent: the score is then the mean outcome
                            of that evaluation's ok results (infra failures are missing data)
    summary["incumbent"]    {"harness": hash, "skill_library": hash, "rubric": hash}: the
                            versions in force at the end of the round
    summary["checkpoint"]   checkpoint id the round hands on
    summary["checkpoints"]  [checkpoint id, ...] saved during the round
    summary["rl_steps"]     [{"step": int, "reward_mean": float, ...}, ...]: one entry per RL
                            step, as coevo.rl.stage.StepLog dumps them ("mean_reward" is
                            accepted as a synonym of "reward_mean")
    summary["rl"]           a coevo.rl.stage.StageResult dump: its "steps", "checkpoint" and
                            "checkpoints" stand in for the three keys above when those are absent

When no round has RL steps, the reward curve falls back to the train-split trajectories: their
mean reward per round (the store does not record the step of a trajectory, so this fallback is
one point per round, not per step).

Budget limits come from the run config: `config["budget"]` (or `config["budgets"]`), a mapping
of kind -> limit, where a key may also be spelled `max_<kind>` (e.g. `max_rollouts`). Spent
amounts are the store's budget ledger (`store.budget_totals`).
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from coevo.assets.base import format_diff
from coevo.errors import Ambiguous, NotFound
from coevo.store.records import (REVIEW_POLICY, DecisionRecord, ProposalRecord, RunRecord,
                                  edit_text)
from coevo.store.lease import INTERRUPTED_HINT
from coevo.store.store import Store
from coevo.terminal import plain, safe

ASSET_SLOTS = ("harness", "skill_library", "rubric")
STATUS_STYLE = {"accepted": "green", "rejected": "red", "invalid": "magenta", "pending": "yellow"}
_SHORT = 12  # hash / id prefix shown; the store resolves prefixes of 4+ hex digits


# --- plain data ------------------------------------------------------------------------------


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RLStep(_Row):
    round: int
    step: int
    reward_mean: float


class RoundRow(_Row):
    index: int
    status: str
    started_at: datetime
    ended_at: datetime | None
    val_score: float | None = None
    test_score: float | None = None
    incumbent: dict[str, str] = Field(default_factory=dict)
    checkpoint: str | None = None
    checkpoints: list[str] = Field(default_factory=list)
    budget: dict[str, float] = Field(default_factory=dict)
    proposals: int = 0
    accepted: int = 0


class BudgetRow(_Row):
    kind: str
    spent: float
    limit: float | None = None

    @property
    def fraction(self) -> float | None:
        return self.spent / self.limit if self.limit else None


class ProposalRow(_Row):
    id: str
    run: str | None
    round: int | None
    proposer: str
    kind: str
    status: str
    parent: str | None
    candidate: str | None
    reason: str  # the latest decision's reason; the error for an invalid proposal
    mean_diff: float | None = None
    p_value: float | None = None  # Holm-adjusted when the gate recorded it
    rollouts: int = 0
    gate_accepted: bool | None = None  # the gate's own verdict (None: not gated), not a review's


def _num(value: Any) -> float | None:
    """A finite float, or None for anything else (missing keys degrade, never crash)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _eval_score(store: Store, summary: Mapping[str, Any], split: str) -> float | None:
    evs = summary.get("evaluations")
    ev_id = evs.get(split) if isinstance(evs, Mapping) else None
    if not isinstance(ev_id, str):
        return None
    try:
        ev = store.get_evaluation(ev_id)
    except NotFound:
        return None
    vals = [r.outcome for r in ev.results if r.status == "ok" and r.outcome is not None]
    return sum(vals) / len(vals) if vals else None


def _rl(summary: Mapping[str, Any]) -> Mapping[str, Any]:
    rl = summary.get("rl")
    return rl if isinstance(rl, Mapping) else {}


def _summary_steps(index: int, summary: Mapping[str, Any]) -> list[RLStep]:
    steps = summary.get("rl_steps")
    if not isinstance(steps, list):
        steps = _rl(summary).get("steps")
    out = []
    for i, s in enumerate(steps if isinstance(steps, list) else []):
        if not isinstance(s, Mapping):
            continue
        r = _num(s.get("reward_mean", s.get("mean_reward")))
        step = s.get("step", i)
        if r is not None and isinstance(step, int):
            out.append(RLStep(round=index, step=step, reward_mean=r))
    return out


def _run(store: Store, run: str | RunRecord) -> RunRecord:
    return run if isinstance(run, RunRecord) else store.get_run(run)


def round_rows(store: Store, run: str | RunRecord) -> list[RoundRow]:
    """One row per round: scores, incumbent versions, checkpoint, budget spent, proposals."""
    rec = _run(store, run)
    props = store.proposals(run=rec.id)
    out = []
    for r in store.rounds(rec.id):
        s = r.summary or {}
        inc = s.get("incumbent") if isinstance(s.get("incumbent"), Mapping) else {}
        ckpts = s.get("checkpoints", _rl(s).get("checkpoints"))
        ckpt = s.get("checkpoint", _rl(s).get("checkpoint"))
        val = _num(s.get("val_score"))
        test = _num(s.get("test_score"))
        mine = [p for p in props if p.round == r.index]
        out.append(RoundRow(
            index=r.index, status=r.status, started_at=r.started_at, ended_at=r.ended_at,
            val_score=val if val is not None else _eval_score(store, s, "val"),
            test_score=test if test is not None else _eval_score(store, s, "test"),
            incumbent={k: v for k, v in inc.items() if k in ASSET_SLOTS and isinstance(v, str)},
            checkpoint=ckpt if isinstance(ckpt, str) else None,
            checkpoints=[c for c in ckpts if isinstance(c, str)] if isinstance(ckpts, list) else [],
            budget=store.budget_totals(rec.id, round=r.index),
            proposals=len(mine), accepted=sum(p.status == "accepted" for p in mine)))
    return out


def budget_limits(config: Mapping[str, Any]) -> dict[str, float]:
    """kind -> limit from a run config (see the module docstring).

    >>> budget_limits({"budget": {"max_rollouts": 100, "tokens": 5e4, "note": "x"}})
    {'rollouts': 100.0, 'tokens': 50000.0}
    """
    raw = config.get("budget", config.get("budgets"))
    if not isinstance(raw, Mapping):
        return {}
    out = {}
    for k, v in raw.items():
        if _num(v) is not None:
            out[k.removeprefix("max_")] = float(v)
    return out


def budget_rows(store: Store, run: str | RunRecord) -> list[BudgetRow]:
    """Spent vs limit per budget kind (kinds with a limit but nothing spent show 0 spent)."""
    rec = _run(store, run)
    spent = store.budget_totals(rec.id)
    limits = budget_limits(rec.config)
    return [BudgetRow(kind=k, spent=spent.get(k, 0.0), limit=limits.get(k))
            for k in sorted(spent.keys() | limits.keys())]


def rl_steps(store: Store, run: str | RunRecord) -> list[RLStep]:
    """RL reward per step from the round summaries, else mean train reward per round from the
    stored trajectories (step = round index; see the module docstring)."""
    rec = _run(store, run)
    steps = [st for r in store.rounds(rec.id) for st in _summary_steps(r.index, r.summary or {})]
    if steps:
        return steps
    out = []
    for r in store.rounds(rec.id):  # trajectories carry no round field: ask round by round
        vals = [t.reward for t in store.trajectories(run=rec.id, round=r.index, split="train")
                if t.status == "ok" and t.reward is not None]
        if vals:
            out.append(RLStep(round=r.index, step=r.index, reward_mean=sum(vals) / len(vals)))
    return out


def _stat(d: DecisionRecord | None, *keys: str) -> float | None:
    if d is None:
        return None
    for k in keys:
        v = _num(d.statistic.get(k))
        if v is not None:
            return v
    return None


def _mean_diff(d: DecisionRecord | None) -> float | None:
    """The decision's mean difference per val task (candidate - what it was compared with):
    the gate's `mean_diff`; a peer mode's (coevo/modes/) val-mean rule stored the candidate's
    val mean and its reference's over the same tasks: bettertogether's and skillopt's the
    incumbent's under the same checkpoint and seeds (a paired difference, as the gate's), fst's
    its parent member's stored scores, measured under the checkpoint of the round the member
    joined (for the seed member, before the round's RL stage), so an fst delta includes what
    RL changed since then."""
    direct = _stat(d, "mean_diff")
    if direct is not None:
        return direct
    cand, ref = _stat(d, "val_mean"), _stat(d, "incumbent_val_mean", "parent_val_mean")
    return cand - ref if cand is not None and ref is not None else None


def proposal_rows(store: Store, run: str | None = None, status: str | None = None) -> list[ProposalRow]:
    """Proposals (oldest first) with the latest decision's reason and the gate's headline
    statistics."""
    out = []
    for p in store.proposals(run=run, status=status):
        decs = store.decisions(p.id)
        d = decs[-1] if decs else None  # a human review's, when one was applied
        gate = next((x for x in reversed(decs) if x.policy != REVIEW_POLICY), None)
        reason = d.reason if d else (p.error or "")
        out.append(ProposalRow(
            id=p.id, run=p.run, round=p.round, proposer=p.proposer, kind=p.kind,
            status=p.status, parent=p.parent, candidate=p.candidate, reason=reason,
            mean_diff=_mean_diff(gate), p_value=_stat(gate, "p_adjusted", "p_value"),
            rollouts=gate.rollouts if gate else 0, gate_accepted=gate.accepted if gate else None))
    return out


# --- rendering helpers ---------------------------------------------------------------------------


def short(ref: str | None) -> str:
    return ref[:_SHORT] if ref else "-"


def fmt(value: float | None, digits: int = 3) -> str:
    """A number for a table: "-" when missing, integers without decimals."""
    if value is None:
        return "-"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.{digits}f}"


def render_text(renderable: RenderableType, width: int = 120) -> str:
    """Plain text of a rich renderable (for tests, logs and `--plain` CLI output)."""
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def _status(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


# --- views -----------------------------------------------------------------------------------


def runs_table(store: Store) -> Table:
    """Every run: id, name, mode, status, rounds, proposals accepted / made, last val score."""
    t = Table(title="runs")
    for col in ("id", "name", "mode", "status", "rounds", "accepted/proposals", "val", "created"):
        t.add_column(col, justify="right" if col in ("rounds", "val") else "left")
    for run in store.runs():
        rows = round_rows(store, run)
        props = store.proposals(run=run.id)
        vals = [r.val_score for r in rows if r.val_score is not None]
        t.add_row(short(run.id), plain(run.name), plain(run.mode), store.shown_status(run),
                  str(len(rows)), f"{sum(p.status == 'accepted' for p in props)}/{len(props)}",
                  fmt(vals[-1] if vals else None), f"{run.created_at:%Y-%m-%d %H:%M}")
    return t


def run_view(store: Store, run: str) -> Group:
    """One run: its rounds (val and test score, incumbent versions, checkpoint, spend), budgets
    spent vs limits, and checkpoints."""
    rec = _run(store, run)
    rows = round_rows(store, rec)
    status = store.shown_status(rec)
    head = Text.assemble((safe(rec.name), "bold"), f"  id {rec.id}  mode {safe(rec.mode)}  status ",
                         (status, "bold"), f"  error: {safe(rec.error)}" if rec.error else "",
                         f"  ({INTERRUPTED_HINT})" if status == "interrupted" else "")

    rt = Table(title="rounds")
    for col in ("round", "status", "val", "test", "harness", "skill_library", "rubric",
                "checkpoint", "accepted/proposals", "rollouts", "tokens"):
        rt.add_column(col)
    for r in rows:
        rt.add_row(str(r.index), r.status, fmt(r.val_score), fmt(r.test_score),
                   *(short(r.incumbent.get(k)) for k in ASSET_SLOTS), short(r.checkpoint),
                   f"{r.accepted}/{r.proposals}", fmt(r.budget.get("rollouts")),
                   fmt(r.budget.get("tokens")))

    bt = Table(title="budgets")
    for col in ("kind", "spent", "limit", "used"):
        bt.add_column(col, justify="left" if col == "kind" else "right")
    for b in budget_rows(store, rec):
        frac = b.fraction
        bt.add_row(b.kind, fmt(b.spent, 1), fmt(b.limit, 1),
                   Text(f"{frac:.0%}", style="red" if frac > 1 else "") if frac is not None else "-")

    ct = Table(title="checkpoints")
    for col in ("round", "id", "step", "sha256", "path"):
        ct.add_column(col)
    for r, c in run_checkpoints(store, rec, rows):
        ct.add_row(fmt(r), short(c.id), str(c.step), short(c.sha256), plain(c.path))
    return Group(head, rt, bt, ct)


def run_checkpoints(store: Store, rec: RunRecord,
                    rows: list[RoundRow] | None = None) -> list[tuple[int | None, Any]]:
    """(round, checkpoint) of the checkpoints the round summaries name, plus the run's latest
    one, oldest step first. (The store has no per-run checkpoint listing.)"""
    seen: dict[str, Any] = {}
    for r in rows if rows is not None else round_rows(store, rec):
        for cid in [*r.checkpoints, *([r.checkpoint] if r.checkpoint else [])]:
            if cid not in seen:
                try:
                    seen[cid] = store.get_checkpoint(cid)
                except NotFound:
                    continue
    latest = store.latest_checkpoint(rec.id)
    if latest is not None:
        seen.setdefault(latest.id, latest)
    return [(c.round, c) for c in sorted(seen.values(), key=lambda c: (c.step, c.created_at))]


def proposals_table(store: Store, run: str | None = None, status: str | None = None) -> Table:
    """Proposals with their status, gate statistics and the decision's reason (or the error)."""
    t = Table(title="proposals" + (f" ({status})" if status else ""))
    for col in ("id", "round", "proposer", "kind", "status", "parent", "candidate", "diff",
                "p", "rollouts", "reason"):
        t.add_column(col, overflow="fold")
    for p in proposal_rows(store, run=run, status=status):
        t.add_row(short(p.id), fmt(p.round), plain(p.proposer), plain(p.kind), _status(p.status),
                  short(p.parent), short(p.candidate),
                  f"{p.mean_diff:+.3f}" if p.mean_diff is not None else "-",
                  fmt(p.p_value, 4), str(p.rollouts), plain(p.reason))
    return t


def find_proposal(store: Store, ref: str) -> ProposalRecord:
    """A proposal by full id or unique id prefix."""
    try:
        return store.get_proposal(ref)
    except NotFound:
        pass
    hits = [p for p in store.proposals() if p.id.startswith(ref)] if len(ref) >= 4 else []
    if len(hits) > 1:
        raise Ambiguous(ref, [f"{short(p.id)} ({p.proposer}, {p.status})" for p in hits])
    if not hits:
        raise NotFound(f"no proposal with id or id prefix {ref!r} (prefixes need 4+ characters)")
    return hits[0]


def proposal_diff(store: Store, p: ProposalRecord) -> str:
    """The candidate's diff against its parent, from the stored versions; the proposal's own
    recorded diff when either side is missing (an invalid proposal may have no candidate)."""
    if p.parent and p.candidate:
        return format_diff(store.get_asset(None, p.parent), store.get_asset(None, p.candidate))
    if p.diff:
        return "".join(str(p.diff[k]) for k in sorted(p.diff))
    return "(no candidate version was stored)\n"


def _diff_text(diff: str) -> Text:
    out = Text()
    for line in diff.splitlines(keepends=True):
        style = ("bold" if line.startswith(("+++", "---")) else "green" if line.startswith("+")
                 else "red" if line.startswith("-") else "cyan" if line.startswith("@@") else "")
        out.append(safe(line), style=style)
    return out


def proposal_view(store: Store, id: str, show_prompt: bool = False) -> Group:
    """One proposal: who proposed what and why, the diff, and every gate decision with its
    per-task evidence, statistics and reason. Invalid proposals show the error and raw output."""
    p = find_proposal(store, id)
    meta = Table.grid(padding=(0, 2))
    meta.add_column(style="bold")
    meta.add_column(overflow="fold")
    for k, v in (("proposal", p.id), ("run", p.run or "-"), ("round", fmt(p.round)),
                 ("proposer", p.proposer + (f" (model {p.model})" if p.model else "")),
                 ("kind", p.kind), ("status", _status(p.status)),
                 ("parent", p.parent or "-"), ("candidate", p.candidate or "-"),
                 ("created", f"{p.created_at:%Y-%m-%d %H:%M:%S}"),
                 ("rationale", p.rationale or "-"), ("predicted effect", p.predicted_effect or "-")):
        meta.add_row(k, v if isinstance(v, Text) else plain(v))
    parts: list[RenderableType] = [meta]
    if p.edits:  # what the model chose, as it chose it (the `edits` proposer)
        parts.append(Panel(plain("\n".join(f"{i}. {edit_text(e)}" for i, e in enumerate(p.edits, 1))),
                           title=f"edits ({len(p.edits)})"))
    parts.append(Panel(_diff_text(proposal_diff(store, p)), title="diff"))
    if p.status == "invalid" or p.error:
        parts.append(Panel(plain(p.error or "-", style="magenta"), title="error"))
        parts.append(Panel(plain(p.raw_output or "(empty)"), title="raw output"))
    if show_prompt:
        parts.append(Panel(plain(p.prompt or "(empty)"), title="proposer prompt"))
    decisions = store.decisions(p.id)
    if not decisions and p.status != "invalid":
        parts.append(Text("no gate decision yet", style="yellow"))
    for d in decisions:
        parts.extend(_decision_parts(d))
    if p.status == "pending" and any(d.accepted for d in decisions):
        parts.append(Text("awaiting human review (coevo proposals approve|veto)", style="yellow"))
    for rv in store.reviews(proposal=p.id):
        parts.append(plain(f"review {short(rv.id)}: {rv.decision} by {rv.by} at "
                           f"{rv.created_at:%Y-%m-%d %H:%M}" + (f": {rv.note}" if rv.note else "")))
    return Group(*parts)


def _decision_parts(d: DecisionRecord) -> list[RenderableType]:
    verdict = Text.assemble(("accepted" if d.accepted else "rejected",
                             "bold green" if d.accepted else "bold red"),
                            f"  policy {safe(d.policy)}  metric {safe(d.metric or '-')}"
                            f"  rollouts {d.rollouts}  decision {short(d.id)}")
    partial = any(e.incumbent_partial is not None or e.candidate_partial is not None
                  for e in d.evidence)
    ev = Table(title=f"evidence ({len(d.evidence)} pairs)")
    cols = ["task", "sample", "incumbent", "candidate", "diff"]
    cols += ["incumbent partial", "candidate partial"] if partial else []
    for col in [*cols, "status"]:
        ev.add_column(col, justify="left" if col in ("task", "status") else "right")
    for e in d.evidence:
        delta = (e.candidate - e.incumbent if e.candidate is not None and e.incumbent is not None
                 else None)
        extra = [fmt(e.incumbent_partial), fmt(e.candidate_partial)] if partial else []
        ev.add_row(plain(e.task_id), str(e.sample), fmt(e.incumbent), fmt(e.candidate),
                   f"{delta:+.3f}" if delta is not None else "-", *extra,
                   plain(e.status, style="" if e.status == "ok" else "magenta"))
    st = Table(title="statistics")
    st.add_column("statistic")
    st.add_column("value", justify="right")
    for k in sorted(d.statistic):
        v = d.statistic[k]
        st.add_row(plain(k), fmt(_num(v), 4) if _num(v) is not None else plain(v))
    parts: list[RenderableType] = [verdict, ev, st]
    if d.stages:  # the sequential comparison; the last stage is the stop the reason cites
        sg = Table(title="stages")
        for col in ("stage", "tasks", "wins", "losses", "ties", "p", "action", "rule"):
            sg.add_column(col, justify="left" if col in ("stage", "action", "rule") else "right")
        for x in d.stages:
            sg.add_row(plain(x["name"]), f"{x['tasks_total']}", str(x["wins"]), str(x["losses"]),
                       str(x["ties"]), fmt(x["p_value"], 4), plain(x["action"]), plain(x["rule"]))
        parts.append(sg)
    return [*parts, Panel(plain(d.reason), title="reason")]


def lineage_tree(store: Store, version_ref: str, kind: str | None = None) -> Tree:
    """The version's ancestors (root first) down to it, then everything derived from it, each
    node with the status of the proposal that produced it (when one did)."""
    me = store.resolve(kind, version_ref)
    ancestors = list(reversed(store.ancestors(me.hash)))  # root first
    descendants = store.descendants(me.hash)
    by_candidate: dict[str, list[ProposalRecord]] = defaultdict(list)
    for p in store.proposals():
        if p.candidate:
            by_candidate[p.candidate].append(p)

    def label(rec: Any, this: bool = False) -> Text:
        t = Text.assemble((short(rec.hash), "bold" if this else ""), f"  {rec.kind} {safe(rec.name)}",
                          f"  {rec.created_at:%Y-%m-%d %H:%M}")
        for p in by_candidate.get(rec.hash, []):
            t.append("  ")
            t.append(f"{p.status}", style=STATUS_STYLE.get(p.status, ""))
            t.append(f" by {safe(p.proposer)} ({short(p.id)})")
        if this:
            t.append("  <- this version", style="bold cyan")
        return t

    chain = [*ancestors, me]
    tree = Tree(label(chain[0], this=len(chain) == 1))
    node = tree
    for rec in chain[1:]:
        node = node.add(label(rec, this=rec.hash == me.hash))
    children: dict[str, list[Any]] = defaultdict(list)
    for d in descendants:
        children[d.parent].append(d)

    def grow(parent_node: Tree, h: str) -> None:
        for c in children.get(h, []):
            grow(parent_node.add(label(c)), c.hash)

    grow(node, me.hash)
    return tree

