"""The reviewer's pages about runs, rounds, searches and assets: each function reads what one
page shows from the store (through coevo.store and its read-only queries) and returns the
template's context. The proposal, evidence and trajectory pages are in proposal.py, blame and
lineage in versions.py. Nothing here renders HTML or writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import yaml

from coevo.errors import CoevoError, NotFound
from coevo.serve.charts import Series, line_chart
from coevo.store import RoundRecord, RunRecord, Store
from coevo.store.queries import (
    SLOTS,
    ProposalFilter,
    RunStats,
    asset_names,
    count_proposals,
    count_runs,
    proposal_facets,
    proposals_page,
    round_start_incumbent,
    run_stats,
    runs_page,
)
from coevo.store.records import PROPOSAL_STATUSES

RUNS_PER_PAGE = 25
PROPOSALS_PER_PAGE = 50


class BadRequest(CoevoError):
    """A request the app cannot answer as asked (a bad page number, a filter value): 400."""


@dataclass(frozen=True)
class Page:
    """One page of a list: 1-based `number`, `size` rows a page, `total` rows in all."""

    number: int
    size: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))

    @property
    def offset(self) -> int:
        return (self.number - 1) * self.size

    def check(self) -> "Page":
        if self.number > self.pages:
            raise NotFound(f"page {self.number} does not exist: there are {self.pages} "
                           f"page(s) of {self.size} ({self.total} rows)")
        return self

    def link(self, number: int, params: Mapping[str, Any]) -> str:
        """The query string of page `number` with the same filters."""
        keep = {k: v for k, v in params.items() if v not in (None, "") and k != "page"}
        return "?" + urlencode({**keep, "page": number})


# --- shared pieces -------------------------------------------------------------------------------


def number(value: Any) -> float | None:
    """A finite float, or None (a summary key that is missing or malformed shows as "-")."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if f == f and abs(f) != float("inf") else None


def interval(value: Any) -> tuple[float, float] | None:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        lo, hi = number(value[0]), number(value[1])
        if lo is not None and hi is not None:
            return lo, hi
    return None


def run_env(rec: RunRecord) -> str:
    cfg = rec.config.get("config") if isinstance(rec.config.get("config"), Mapping) else {}
    return str(cfg.get("env", "-"))


def val_series(label: str, rounds: Sequence[RoundRecord]) -> Series:
    """Val score per round on x = 0 (the seed, before round 0), 1 (after round 0), ..."""
    s = Series(label, [])
    if rounds:
        first = rounds[0].summary
        if number(first.get("val_start_score")) is not None:
            s.points.append((0, number(first["val_start_score"])))  # type: ignore[arg-type]
            if ci := interval(first.get("val_start_ci")):
                s.bands.append((0, *ci))
    for r in rounds:
        v = number(r.summary.get("val_score"))
        if v is not None:
            s.points.append((r.index + 1, v))
            if ci := interval(r.summary.get("val_ci")):
                s.bands.append((r.index + 1, *ci))
    return s


def x_labels(n_rounds: int) -> list[str]:
    return ["seed"] + [f"round {i}" for i in range(n_rounds)]


def final_test(rounds: Sequence[RoundRecord]) -> tuple[float | None, tuple[float, float] | None]:
    for r in reversed(rounds):
        v = number(r.summary.get("test_score"))
        if v is not None:
            return v, interval(r.summary.get("test_ci"))
    return None, None


def final_incumbent(rec: RunRecord, rounds: Sequence[RoundRecord]) -> dict[str, str | None]:
    hashes: Mapping[str, Any] = rec.config.get("seed") or {}
    for r in rounds:
        if r.status == "done" and isinstance(r.summary.get("incumbent"), Mapping):
            hashes = r.summary["incumbent"]
    return {k: hashes.get(k) for k in SLOTS}


def rollout_split(stats: RunStats) -> dict[str, float]:
    """The ledger's `rollouts` split by who spent them. The gate's arms, harness-only train
    rollouts and the loop's val tracking are evaluations (val tracking is charged apart, as
    `eval_rollouts`); what is left of `rollouts` is the RL stage's."""
    ep = stats.episodes
    gate = max(ep.get("val", 0) - stats.spent.get("eval_rollouts", 0.0), 0.0)
    train = float(ep.get("train", 0))
    rl = max(stats.spent.get("rollouts", 0.0) - gate - train, 0.0)
    return {"RL rollouts": rl, "gate rollouts (both arms)": gate,
            "train rollouts (harness-only)": train}


def spend_rows(stats: RunStats) -> list[tuple[str, float]]:
    """The ledger's totals by kind, then `rollouts` split by who spent them (rollout_split),
    then the final test's episodes (not charged: measurement)."""
    rows = list(stats.spent.items())
    if "rollouts" in stats.spent:
        rows += [(f"rollouts: {k}", v) for k, v in rollout_split(stats).items() if v]
    if stats.episodes.get("test"):
        rows.append(("test episodes (not charged)", float(stats.episodes["test"])))
    return rows


@dataclass(frozen=True)
class RunRow:
    rec: RunRecord
    stats: RunStats
    env: str
    val_start: float | None
    val_last: float | None
    test: float | None
    test_ci: tuple[float, float] | None
    gate_rollouts: float
    status: str  # the store's shown_status: `interrupted` for a `running` run no process holds


def run_row(store: Store, rec: RunRecord, stats: RunStats) -> RunRow:
    s = val_series(rec.name, stats.rounds)
    test, ci = final_test(stats.rounds)
    pts = dict(s.points)
    return RunRow(rec, stats, run_env(rec), pts.get(0), s.points[-1][1] if s.points else None,
                  test, ci, rollout_split(stats)["gate rollouts (both arms)"],
                  store.shown_status(rec))


# --- pages ---------------------------------------------------------------------------------------


def runs_page_view(store: Store, page: int) -> dict[str, Any]:
    pg = Page(page, RUNS_PER_PAGE, count_runs(store)).check()
    recs = runs_page(store, pg.offset, pg.size)
    stats = run_stats(store, [r.id for r in recs])
    return {"rows": [run_row(store, r, stats[r.id]) for r in recs], "page": pg, "params": {}}


def run_view(store: Store, ref: str, page: int) -> dict[str, Any]:
    rec = store.get_run(ref)
    stats = run_stats(store, [rec.id])[rec.id]
    row = run_row(store, rec, stats)
    pg = Page(page, PROPOSALS_PER_PAGE, count_proposals(store, ProposalFilter(run=rec.id))).check()
    props = proposals_page(store, ProposalFilter(run=rec.id), pg.offset, pg.size)
    n = len(stats.rounds)
    chart = line_chart([val_series(rec.name, stats.rounds)], x_labels(n),
                       "validation score (seed, then after each round)", "val score")
    return {
        "run": rec, "row": row, "chart": chart, "spend": spend_rows(stats),
        "rounds": [_round_line(r) for r in stats.rounds],
        "config": yaml.safe_dump(rec.config.get("config", rec.config), sort_keys=False,
                                 allow_unicode=True),
        "incumbent": final_incumbent(rec, stats.rounds), "proposals": props, "page": pg,
        "params": {},
    }


def _round_line(r: RoundRecord) -> dict[str, Any]:
    s = r.summary
    inc = s.get("incumbent") if isinstance(s.get("incumbent"), Mapping) else {}
    spent = s.get("spent") if isinstance(s.get("spent"), Mapping) else {}
    return {"index": r.index, "status": r.status, "val": number(s.get("val_score")),
            "test": number(s.get("test_score")), "accepted": len(s.get("accepted") or []),
            "rollouts": number(spent.get("rollouts")), "incumbent": inc,
            "stop": s.get("stop"), "steps": len(s.get("rl_steps") or [])}


def compare_view(store: Store, refs: Sequence[str]) -> dict[str, Any]:
    refs = list(dict.fromkeys(r for r in refs if r))
    if len(refs) < 2:
        raise BadRequest("compare needs two or more runs: tick them on the runs page "
                         "(or give ?run=A&run=B)")
    if len(refs) > 8:
        raise BadRequest(f"compare shows at most 8 runs at once; {len(refs)} were given")
    recs = [store.get_run(r) for r in refs]
    stats = run_stats(store, [r.id for r in recs])
    rows = [run_row(store, r, stats[r.id]) for r in recs]
    n = max((len(stats[r.id].rounds) for r in recs), default=0)
    chart = line_chart([val_series(r.name, stats[r.id].rounds) for r in recs], x_labels(n),
                       "validation score per round", "val score", width=760)
    kinds = list(dict.fromkeys(k for r in rows for k, _ in spend_rows(r.stats)))
    spend = {k: [dict(spend_rows(r.stats)).get(k) for r in rows] for k in kinds}
    return {"rows": rows, "chart": chart, "spend": spend}


def round_view(store: Store, ref: str, index: int) -> dict[str, Any]:
    rec = store.get_run(ref)
    rnd = store.get_round(rec.id, index)
    s = rnd.summary
    props = proposals_page(store, ProposalFilter(run=rec.id, round=index), 0, 500)
    before = round_start_incumbent(store, rec.id, index)
    after_raw = s.get("incumbent") if isinstance(s.get("incumbent"), Mapping) else None
    after = {k: after_raw.get(k) for k in SLOTS} if after_raw else None
    steps = [x for x in (s.get("rl_steps") or []) if isinstance(x, Mapping)]
    n_rounds = len(store.rounds(rec.id))
    return {
        "run": rec, "round": rnd, "steps": steps, "proposals": props, "before": before,
        "after": after, "spent": store.budget_totals(rec.id, round=index),
        "val": number(s.get("val_score")), "val_ci": interval(s.get("val_ci")),
        "val_start": number(s.get("val_start_score")), "test": number(s.get("test_score")),
        "test_ci": interval(s.get("test_ci")), "stop": s.get("stop"),
        "checkpoint": s.get("checkpoint"), "prev": index - 1 if index > 0 else None,
        "next": index + 1 if index + 1 < n_rounds else None,
    }


def search_view(store: Store, params: Mapping[str, str], page: int) -> dict[str, Any]:
    status = params.get("status") or None
    if status is not None and status not in PROPOSAL_STATUSES:
        raise BadRequest(f"status {status!r}: expected one of {', '.join(PROPOSAL_STATUSES)}")
    text = (params.get("q") or "").strip() or None
    if text is not None and len(text) > 200:
        raise BadRequest("search text: at most 200 characters")
    f = ProposalFilter(run=params.get("run") or None, status=status,
                       proposer=params.get("proposer") or None, kind=params.get("kind") or None,
                       text=text)
    pg = Page(page, PROPOSALS_PER_PAGE, count_proposals(store, f)).check()
    rows = proposals_page(store, f, pg.offset, pg.size, newest_first=True)
    facets = proposal_facets(store)
    return {"proposals": rows, "page": pg, "filter": f, "facets": facets,
            "statuses": PROPOSAL_STATUSES, "params": {k: v for k, v in params.items() if v},
            "run_name": store.get_run(f.run).name if f.run else None}


def assets_view(store: Store) -> dict[str, Any]:
    rows = asset_names(store)
    for r in rows:  # what a new run would start from: the latest version the gate stood behind
        r["current"] = store.resolve(r["kind"], r["name"]).hash
    return {"rows": rows}
