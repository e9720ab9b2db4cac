"""A run logged to an experiment tracker as it goes: the RunObserver of coevo/observer.py.

What is logged (keys "group/name"; RL metrics stepped by trainer step, round metrics by round):
- params, once, when the tracker run is created: the run config flattened ("gate.alpha"),
  the seed asset hashes ("seed.harness"); tags / config: coevo.run_id, coevo.run, coevo.mode;
- every RL step: rl/reward_mean, rl/signal_fraction, rl/loss, rl/kl, rl/rollouts, ...;
- every round: val/score with val/ci_low, val/ci_high (and val/score_start, the seed's, at
  round 0), gate/candidates, gate/accepted, gate/rejected, gate/invalid, gate/pending, the
  proposers' cost propose/<kind> (calls, tokens, seconds), the round's spend spent/<kind>,
  and a table "gate/decisions": per proposal its id, kind, proposer, candidate hash, status,
  policy, accepted, reason and the gate's statistics;
- the final test evaluation: test/score, test/ci_low, test/ci_high, test/success_rate, ...
The tracker's run id goes into coevo's store with the run (`Store.set_trackers`).

Failures. Tracking never breaks a run: a tracker error (a server down, a folder that cannot
be written) is reported in one line and the run goes on untracked for the rest of the
process. Only a missing package is an error, before the run starts (`TrackingSpec.check`).

Resume. The link stored with the run says which rounds (and whether the final evaluation)
were logged; a resumed process continues the same tracker run and logs what is missing,
once. A tracker run created for a run that already has history (tracking added on resume,
or the old tracker run is gone) first gets that history from the store, RL steps included.
An RL step redone after a crash may appear twice at its step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from coevo.oneline import one_line
from coevo.tracking.base import Tracker, TrackerLink, TrackingSpec, flatten

PROPOSE_KEY = "propose:"  # the prefix of a proposer charge's key (coevo/loop.py propose_step)
_STEP_SKIP = {"step", "index", "of", "checkpoint"}  # StepLog fields that are not metrics


class TrackingObserver:
    """Logs one coevo run to the tracker `spec` names (see the module docstring)."""

    def __init__(self, spec: TrackingSpec, store: Any, say: Callable[[str], None]):
        self.spec, self.store, self.say = spec, store, say
        self.tracker: Tracker | None = None
        self.run_id = ""
        self.link: TrackerLink | None = None

    def start(self, run_id: str) -> None:
        rec = self.store.get_run(run_id)
        self.run_id = run_id
        old = next((x for x in links(rec.config) if (x.backend, x.project)
                    == (self.spec.backend, self.spec.project)), None)
        self.tracker = self._guard(lambda: self.spec.open(
            name=rec.name, resume_id=old.run_id if old else None, params=run_params(rec.config),
            tags={"coevo.run_id": rec.id, "coevo.run": rec.name, "coevo.mode": rec.mode}))
        if self.tracker is None:
            return
        t = self.tracker
        keep = old if old is not None and t.resumed else None
        self.link = TrackerLink(backend=t.backend, project=self.spec.project,
                                location=t.location, run_id=t.run_id, name=rec.name,
                                rounds=keep.rounds if keep else 0, final=keep.final if keep else None)
        self._save()
        self.say(f"tracking: {t.backend} run {t.run_id} ({'continued' if t.resumed else 'new'}), "
                 f"project {self.spec.project}, at {t.location}")
        self._catch_up(history=not t.resumed)

    def rl_step(self, r: int, entry: Any) -> None:
        self._log(rl_metrics(entry), entry.step)

    def round_done(self, r: int) -> None:
        if self.tracker is None or self.link is None:
            return
        rec = self.store.get_round(self.run_id, r)
        self._log(round_metrics(self.store, self.run_id, r, rec.summary), r)
        table = decision_rows(self.store, self.run_id, r, rec.summary)
        if table and self.tracker is not None:
            self._guard(lambda: self.tracker.log_table("gate/decisions", table, r))
        if self.tracker is not None:
            self.link.rounds = max(self.link.rounds, r + 1)
            self._save()

    def finished(self, final: Any) -> None:
        """The final test, at the last round's step (a run extended by a resume is tested
        anew: its new final evaluation is logged too, at its own last round)."""
        if final is None or self.tracker is None or self.link is None \
                or self.link.final == final.evaluation:
            return
        last = max((x.index for x in self.store.rounds(self.run_id)), default=0)
        self._log(eval_metrics(final, "test"), last)
        if self.tracker is not None:
            self.link.final = final.evaluation
            self._save()

    def close(self, failed: bool) -> None:
        if self.tracker is not None:
            tracker = self.tracker
            self._guard(lambda: tracker.finish(failed=failed))
            self.tracker = None

    # --- helpers ------------------------------------------------------------------------------

    def _catch_up(self, history: bool) -> None:
        """Log what the store has and this tracker run lacks: with `history` (a new tracker
        run) every stored RL step too; the final evaluation when the run already has one."""
        final = None
        for rec in self.store.rounds(self.run_id):
            if history:
                steps = rec.summary.get("rl_steps") or (rec.summary.get("rl") or {}).get("steps", [])
                for e in steps:
                    self._log(rl_metrics(e), e["step"])
            if rec.status == "done" and self.link is not None and rec.index >= self.link.rounds:
                self.round_done(rec.index)
            final = rec.summary.get("final_evaluation") or final
        if final is not None:
            from coevo.evaluate import EvalResult

            ev = self.store.get_evaluation(final)
            self.finished(EvalResult.model_validate({**ev.summary, "evaluation": ev.id}))

    def _log(self, metrics: dict[str, float], step: int) -> None:
        if self.tracker is not None and metrics:
            tracker = self.tracker
            self._guard(lambda: tracker.log_metrics(metrics, step))

    def _guard(self, call: Callable[[], Any]) -> Any:
        """`call()`; a failure is said in one line and ends tracking for this process."""
        try:
            return call()
        except Exception as e:  # noqa: BLE001  (any tracker failure: see the module docstring)
            self.say(failure_line(self.spec.backend, e, "the run goes on without tracking"))
            self.tracker = None
            return None

    def _save(self) -> None:
        rec = self.store.get_run(self.run_id)
        kept = [x for x in links(rec.config)
                if (x.backend, x.project) != (self.link.backend, self.link.project)]
        self.store.set_trackers(self.run_id, [*(x.model_dump() for x in kept),
                                              self.link.model_dump()])


def failure_line(backend: str, e: BaseException, then: str) -> str:
    return f"tracking: {backend}: {one_line(f'{type(e).__name__}: {e}')[:300]}; {then}"


def track_evaluation(flag: str, res: Any, params: dict[str, Any],
                     say: Callable[[str], None]) -> str | None:
    """`coevo eval --track FLAG`: one tracker run per evaluation, named after it: the
    command's settings as params, the evaluation id as a tag, its numbers as <split>/...
    metrics at step 0. Returns the tracker's run id (None: `off`, or it failed, said in one
    line)."""
    spec = TrackingSpec.parse(flag)
    if spec is None:
        return None
    try:
        t = spec.open(name=f"eval-{res.split}-{(res.evaluation or 'unstored')[:12]}", resume_id=None,
                      params=flatten(params), tags={"coevo.evaluation": res.evaluation or ""})
        t.log_metrics(eval_metrics(res, res.split), 0)
        t.finish()
    except Exception as e:  # noqa: BLE001  (never fails the evaluation, which is stored)
        say(failure_line(spec.backend, e, "the evaluation is stored, not tracked"))
        return None
    say(f"tracking: {t.backend} run {t.run_id}, project {spec.project}, at {t.location}")
    return t.run_id


def links(config: dict[str, Any]) -> list[TrackerLink]:
    """The tracker links stored with a run (its config's `trackers`)."""
    return [TrackerLink.model_validate(x) for x in config.get("trackers") or []]


def run_params(config: dict[str, Any]) -> dict[str, Any]:
    """A run's stored config as tracker params: a loop run's RunConfig (without `tracking`,
    which says where to log, not what ran) and seed hashes, a train run's settings."""
    if "config" in config:
        cfg = {k: v for k, v in config["config"].items() if k != "tracking"}
        return {**flatten(cfg), **flatten({"seed": config.get("seed") or {}})}
    return flatten({k: v for k, v in config.items() if k != "trackers"})


def rl_metrics(entry: Any) -> dict[str, float]:
    """An RL step's log (StepLog, or its stored dump) as rl/<field> metrics."""
    data = entry if isinstance(entry, dict) else entry.model_dump()
    return {f"rl/{k}": float(v) for k, v in data.items()
            if k not in _STEP_SKIP and isinstance(v, (int, float)) and v is not None}


def round_metrics(store: Any, run: str, r: int, summary: dict[str, Any]) -> dict[str, float]:
    """Round r's val score, gate counts, proposer cost and spend (see the module docstring)."""
    out: dict[str, float] = {}
    for key, name in (("val", "score"), ("val_start", "score_start")):
        if summary.get(f"{key}_score") is not None:
            out[f"val/{name}"] = summary[f"{key}_score"]
            low, high = summary.get(f"{key}_ci") or (None, None)
            suffix = "" if key == "val" else "_start"
            out.update({f"val/ci_low{suffix}": low, f"val/ci_high{suffix}": high})
    props = store.proposals(run, round=r)
    out["gate/candidates"] = len(props)
    for status in ("accepted", "rejected", "invalid", "pending"):
        out[f"gate/{status}"] = sum(p.status == status for p in props)
    every = store.budget_totals(run, round=r)
    others = store.budget_totals(run, round=r, exclude_prefix=PROPOSE_KEY)
    out.update({f"propose/{k}": v - others.get(k, 0.0) for k, v in every.items()
                if v - others.get(k, 0.0) > 0})
    out.update({f"spent/{k}": v for k, v in (summary.get("spent") or {}).items()})
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def decision_rows(store: Any, run: str, r: int, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per proposal of round r (and per review applied at its start): the gate's
    (or the review's) latest decision with its statistics; an invalid proposal's error."""
    rows = []
    reviewed = [*(summary.get("reviews") or {}).get("approved", []),
                *(summary.get("reviews") or {}).get("rejected", [])]
    props = [*store.proposals(run, round=r), *(store.get_proposal(p) for p in reviewed)]
    for p in props:
        ds = store.decisions(p.id)
        d = ds[-1] if ds else None
        stats = {k: v for k, v in (d.statistic if d else {}).items()
                 if isinstance(v, (int, float, str, bool))}
        rows.append({"round": r, "proposal": p.id, "kind": p.kind, "proposer": p.proposer,
                     "candidate": p.candidate or "", "status": p.status,
                     "policy": d.policy if d else "", "accepted": bool(d and d.accepted),
                     "reason": (d.reason if d else p.error or "")[:500],
                     "rollouts": d.rollouts if d else 0, **stats})
    return rows


def eval_metrics(res: Any, split: str) -> dict[str, float]:
    """An evaluation's numbers as <split>/<name> metrics (partial credit: <split>/criteria/<c>)."""
    out = {"score": res.mean, "ci_low": res.ci_low, "ci_high": res.ci_high,
           "success_rate": res.success_rate, "reward_mean": res.reward_mean,
           "mean_turns": res.mean_turns, "n_tasks": res.n_tasks, "n_episodes": res.n_episodes,
           "infra_failures": res.n_infra_failures, "tokens_total": res.tokens_total,
           "seconds": res.seconds, **{f"criteria/{k}": v for k, v in res.criteria.items()}}
    return {f"{split}/{k}": float(v) for k, v in out.items()
            if v is not None and math.isfinite(float(v))}
