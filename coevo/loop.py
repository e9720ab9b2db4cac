"""The co-evolution outer loop: RL on the weights, then gated revisions of the harness / skills /
rubric, every step recorded in the store so a crashed run resumes where it stopped.

    incumbent = seed assets (+ the run's latest checkpoint)
    for round r:
        incumbent = incumbent.with(approved by review)         # gate.human_review only
        C      = rl_stage(C, incumbent, train split)          # skipped in harness-only mode
        trajs  = store.trajectories(run, r, split="train")
        cands  = proposers.propose(incumbent, trajs)           # skipped in weight-only mode
        for cand: evidence = compare(incumbent, cand, C, val split)  # ungated: none
        decisions = Holm over the round's family; store each with its evidence
        incumbent = incumbent.with(accepted)     # gate.human_review: held until reviewed
    final = evaluate(incumbent, C, test split)                 # once, never seen by the gate

The gate step (coevo/gatestep.py): every candidate of a round is compared with the
ROUND-START incumbent under checkpoint C, with the gate's per-task seeds, at the levels of the
round's Holm family; see that module. With gate.human_review the candidates it accepts wait for
a person's approve / veto; the review step (coevo/reviewstep.py) applies the reviews at the
next round start, and while any candidate waits the rounds run RL only.

Resume. Round rows carry status (running / done) and, when done, the incumbent's hashes;
a round's proposals are written in one transaction with their charges (so on resume they are
reloaded, never re-proposed), and its decisions in another (all or none). Every evaluation
(gate arms, val curve, harness-only train rollouts, the final test) is stored under an
idempotency key with its budget charge in the same transaction, and every charge carries a key
(coevo/ledger.py): a resumed run evaluates and charges nothing twice. The RL stage is always
entered with resume=True, so an interrupted stage continues from its latest stored checkpoint
and a finished one is a no-op. `COEVO_TEST_KILL_AT=<point>` SIGKILLs the process at a named
point (coevo/killpoints.py): a hook for the crash tests, a no-op otherwise.

Observers. `progress(message)` hears a line per stage; `on_count(phase, done, total)` hears
counts as they move (RL steps of a stage, episodes of an evaluation, episodes of one gate
comparison), for a progress display. Neither takes part in the algorithm.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from coevo.artifacts import artifacts_root, check_writable
from coevo.assets.base import diff as asset_diff
from coevo.config import RunConfig
from coevo.errors import CoevoError
from coevo.evaluate import EvalResult, evaluate
from coevo.frozen_splits import check_frozen
from coevo.gateplan import size_val_split
from coevo.gatestep import gate_step
from coevo.killpoints import KILL_ENV, kill_point  # noqa: F401  (KILL_ENV: for the tests)
from coevo.ledger import eval_charge
from coevo.modes import peer_round
from coevo.observer import NoObserver, RunObserver, observing
from coevo.propose.base import (
    Candidate,
    Incumbent,
    ProposalContext,
    Proposer,
    check_candidate,
    dedupe,
    make_proposer,
    stored_candidate,
)
from coevo.propose.feedback import verifier_feedback
from coevo.reviewstep import review_step
from coevo.runtime import runtime_info
from coevo.traces import imported_traces
from coevo.stoprules import why_stop
from coevo.valcurve import track_score

log = logging.getLogger("coevo.loop")
_RESUMABLE_CHANGES = {"rounds", "budgets", "tracking"}  # config keys a resume may change


@dataclass(frozen=True)
class Mode:
    """Which stages a mode runs (the ablations of ARCHITECTURE.md)."""

    train: bool
    propose: bool
    gated: bool
    peer: str | None = None  # a peer method's own round (coevo/modes/), in place of the gate's


MODES = {"gated": Mode(True, True, True), "ungated": Mode(True, True, False),
         "weight-only": Mode(True, False, True), "harness-only": Mode(False, True, True),
         # the peer methods as baselines: their own selection rules, the same budget charges
         "fst": Mode(True, True, False, "fst"),
         "bettertogether": Mode(True, True, False, "bettertogether"),
         "skillopt": Mode(False, True, False, "skillopt")}


@dataclass
class Parts:
    """What the loop runs on. `backend` scores the gate's arms, harness-only train rollouts
    and the final test evaluation; `trainer` (+ `tokenizer`) is the RL policy (None in
    harness-only mode); `rl_backend` samples the RL rollouts (None: the trainer's live
    policy). `live_eval` says `backend` wraps the trainer's own in-memory model, so after the
    RL stage it already holds checkpoint C and must not load the adapter again. `judge`
    answers the rubric's llm_judge criteria (None: `backend`, the policy itself)."""

    env: Any
    backend: Any
    proposers: list[Proposer] = field(default_factory=list)
    trainer: Any = None
    tokenizer: Any = None
    rl_backend: Any = None
    live_eval: bool = False
    judge: Any = None


def preflight(cfg: RunConfig, store: Any, resume: str | None) -> None:
    """What can be checked before a model is loaded or a run created: the run's name is free
    (or, resuming, the run exists), checkpoints can be written where the config says, and the
    tracker's package is installed."""
    if resume is None:
        try:
            old = store.get_run(cfg.name)
        except CoevoError:
            pass
        else:
            why = f" (it failed: {old.error})" if old.status == "failed" and old.error else ""
            raise CoevoError(f"a run named {cfg.name!r} already exists{why}; continue it with "
                             f"--resume {cfg.name} or choose another name")
    else:
        store.get_run(resume)
    if cfg.tracking is not None:
        cfg.tracking.check()  # its package is installed
    if MODES[cfg.mode].train and cfg.rl.stage.checkpoint_dir:
        from coevo.rl.stage import check_checkpoint_dir

        check_checkpoint_dir(cfg.rl.stage.checkpoint_dir)


def build_parts(cfg: RunConfig) -> Parts:
    """Parts from the config: make_env, load_backend, a Trainer over the backend's model."""
    from coevo.envs.registry import make_env

    env = make_env(cfg.env)
    proposers = [make_proposer(p.name, **p.options) for p in cfg.proposers]
    backend = _backend(cfg.model, "model")
    judge = _backend(cfg.judge, "judge") if cfg.judge else None
    if not MODES[cfg.mode].train:
        return Parts(env=env, backend=backend, proposers=proposers, judge=judge)
    from coevo.rl.stage import live_policy
    from coevo.rl.trainer import Trainer

    model, tok = getattr(backend, "model", None), getattr(backend, "tokenizer", None)
    if model is None or tok is None:
        raise CoevoError(f"model.backend: {cfg.model.backend!r} has no local weights to train; "
                         "use an hf or embedded backend, or mode harness-only")
    trainer = Trainer(model, cfg.rl.train, base_model=cfg.model.backend, tokenizer=tok)
    return Parts(env=env, backend=live_policy(trainer, tok), proposers=proposers,
                 trainer=trainer, tokenizer=tok, live_eval=True, judge=judge)


def _backend(spec: Any, field: str) -> Any:
    from coevo.models.registry import load_backend
    from coevo.registry import BadOptions

    try:
        return load_backend(spec.backend, **spec.options)
    except BadOptions as e:
        raise CoevoError(f"{field}.options: {e}") from None


class RunResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run: str
    name: str
    rounds: list[dict[str, Any]] = Field(default_factory=list)  # each round's stored summary
    incumbent: dict[str, str | None]
    final: EvalResult | None = None


@dataclass
class _Run:
    """The loop's state shared by the helpers (one run, one process)."""

    cfg: RunConfig
    store: Any
    parts: Parts
    mode: Mode
    id: str
    val: list[Any]
    test_ids: set[str]
    progress: Callable[[str], None]
    count: Callable[[str, int, int], None]  # (phase, done, total)
    observer: RunObserver = field(default_factory=NoObserver)  # tracking (coevo/observer.py)

    @property
    def judge(self) -> Any:
        """The backend answering llm_judge criteria: the configured judge, else the policy."""
        return self.parts.judge if self.parts.judge is not None else self.parts.backend

    def key(self, *parts: Any) -> str:
        """An idempotency key of this run's evaluations (coevo/store: a unique index)."""
        return hashlib.sha256(json.dumps([self.id, *parts]).encode()).hexdigest()

    def counter(self, phase: str) -> Callable[[int, int], None]:
        """evaluate()'s progress hook: its (done, total) episodes, counted as `phase`."""
        return lambda done, total: self.count(phase, done, total)


def run_coevolution(cfg: RunConfig, store: Any, parts: Parts | None = None, *,
                    resume: str | None = None,
                    progress: Callable[[str], None] | None = None,
                    on_count: Callable[[str, int, int], None] | None = None,
                    observer: RunObserver | None = None) -> RunResult:
    """Run (or with `resume=RUN`, continue) the co-evolution loop of `cfg`; see the module
    docstring (Observers: `progress`, `on_count`). Returns every round's summary, the final
    incumbent and the test evaluation. `observer` watches the run (default: the tracker
    `cfg.tracking` names, if any)."""
    from coevo.tracking import observer_for

    preflight(cfg, store, resume)
    parts = parts or build_parts(cfg)
    cfg = size_val_split(cfg, parts.env, store, resume, progress or log.info)  # target_effect
    check_runnable(cfg, parts, store)                              # before any row is written
    rec = find_or_create_run(cfg, store, parts, resume)
    say = progress or log.info
    watch = observer or observer_for(cfg.tracking, store, say)
    with store.executing(rec.id), observing(watch, rec.id):  # the lease; an error: failed
        run, incumbent, start = open_run(cfg, store, parts, rec, resume, say,
                                         on_count or _no_count)
        run.observer = watch
        for r in range(start, cfg.rounds):
            begin_round(run, r)
            if r == 0:
                track_score(run, r, incumbent, "val_start")        # the seed, before any change
                if cfg.splits.seed_test:
                    track_score(run, r, incumbent, "test_start", split="test")
            incumbent, approved = review_step(run, r, incumbent)  # gate.human_review only
            kill_point(f"after_reviews:{r}")
            if run.mode.peer is None:
                incumbent, accepted = gated_round(run, r, incumbent)
            else:                                                   # fst, bettertogether, skillopt
                incumbent, accepted = peer_round(run, r, incumbent)  # coevo/modes/
            stop = end_round(run, r, incumbent, approved + accepted)
            kill_point(f"after_round:{r}")
            if stop:
                break
        kill_point("before_final")
        final = final_step(run, incumbent)
        watch.finished(final)
    return RunResult(run=run.id, name=cfg.name, rounds=[x.summary for x in store.rounds(run.id)],
                     incumbent=incumbent.hashes(), final=final)


def gated_round(run: _Run, r: int, incumbent: Incumbent) -> tuple[Incumbent, list[Candidate]]:
    """RL, proposals, the gate (the four co-evolution modes): the incumbent with the accepted
    candidates and checkpoint C, and the accepted candidates."""
    incumbent = rl_step(run, r, incumbent)                  # C, held fixed from here on
    kill_point(f"after_rl:{r}")
    trajs = run.store.trajectories(run.id, round=r, split="train")
    cands = propose_step(run, r, incumbent, trajs)           # [(proposal id, Candidate)]
    kill_point(f"after_proposals:{r}")
    accepted = gate_step(run, r, incumbent, cands)           # decisions stored
    kill_point(f"after_decisions:{r}")
    for cand in accepted:
        incumbent = incumbent.with_candidate(cand)
    return incumbent, accepted


# --- run and round bookkeeping -------------------------------------------------------------------


def check_runnable(cfg: RunConfig, parts: Parts, store: Any) -> None:
    """What can fail before the run exists, checked before it does: a split the mode needs
    has no tasks, the store's artifacts folder cannot be written (a configured checkpoint
    folder is checked earlier, by `preflight`). (A run created and then failing on
    these would be left half-written under a name only a resume could reuse.)"""
    mode, env = MODES[cfg.mode], parts.env
    needs = {"train": mode.train or mode.propose, "val": mode.gated and mode.propose
             or mode.peer is not None or cfg.splits.track_val, "test": cfg.final_test}
    for split, needed in needs.items():
        if needed and next(iter(env.tasks(split, 1)), None) is None:
            raise CoevoError(f"env {cfg.env}: the {split} split has no tasks "
                             f"(mode {cfg.mode} needs it)")
    if mode.train and not cfg.rl.stage.checkpoint_dir:  # a configured folder: preflight
        check_writable(artifacts_root(store.engine.url), "the store's artifacts folder")


def find_or_create_run(cfg: RunConfig, store: Any, parts: Parts, resume: str | None) -> Any:
    """The run to execute: `resume`'s (its config may differ from `cfg` only in
    _RESUMABLE_CHANGES), else a new run named `cfg.name` (an existing name is an error)."""
    dump = cfg.model_dump(mode="json")
    if cfg.splits.frozen:  # before anything is stored: a changed benchmark is not the same val set
        check_frozen(cfg.splits.frozen, parts.env, {"val": cfg.splits.val_n, "test": cfg.splits.test_n})
    if resume is None:
        seed = seed_incumbent(cfg, store)
        return store.create_run(cfg.name, config={"config": dump, "seed": seed.hashes(),
                                                  "runtime": runtime_info()},
                                mode=cfg.mode, status="running")
    rec = store.get_run(resume)
    stored = with_defaults(rec.config.get("config", {}))
    changed = sorted(k for k in dump.keys() | stored.keys()
                     if dump.get(k) != stored.get(k) and k not in _RESUMABLE_CHANGES)
    if changed:
        raise CoevoError(f"resume {rec.name}: the config differs from the run's in "
                         f"{', '.join(changed)} (only {', '.join(sorted(_RESUMABLE_CHANGES))} "
                         "may change)")
    return rec


def _no_count(phase: str, done: int, total: int) -> None:
    pass


def open_run(cfg: RunConfig, store: Any, parts: Parts, rec: Any, resume: str | None,
             progress: Callable[[str], None],
             count: Callable[[str, int, int], None]) -> tuple[_Run, Incumbent, int]:
    """Enter the leased run: the state, the incumbent the first round to run starts from, and
    that round's index. A resumed run (a failed one too) is `running` again."""
    if resume is not None:
        if rec.status == "failed":
            progress(f"resuming run {rec.name}, which failed: {rec.error}")
        store.set_run_status(rec.id, "running")
    env = parts.env
    val = list(env.tasks("val", cfg.splits.val_n))
    test_ids = {t.id for t in env.tasks("test")}  # every test task, not only the first test_n
    run = _Run(cfg, store, parts, MODES[cfg.mode], rec.id, val, test_ids, progress, count)
    incumbent, start = incumbent_at(run, rec.config["seed"])
    return run, incumbent, start


def with_defaults(stored: dict[str, Any]) -> dict[str, Any]:
    """A run's stored config as this coevo reads it: a key added since the run was created
    (gate.human_review, say) takes its default, so a resume compares like with like."""
    try:
        return RunConfig.model_validate(stored).model_dump(mode="json")
    except ValidationError:
        return stored


def seed_incumbent(cfg: RunConfig, store: Any) -> Incumbent:
    """The round-0 incumbent, pinned by hash when the run is created (the run records the
    hashes and a resume reads them back, never the names): a name given in `assets` is the
    version loaded from `seed_dir`'s files when that folder has it, else the store's seed
    version of that name (`Store.resolve_seed`: never a revision some run accepted);
    `name@hash` or a hash names one version exactly."""
    a = cfg.assets
    files: dict[tuple[str, str], str] = {}
    if a.seed_dir:
        from coevo.assets.io import load_seed_dir

        with store.transaction():
            for asset in load_seed_dir(a.seed_dir):
                files[(asset.kind, asset.name)] = store.put_asset(asset)

    def pin(kind: str, ref: str) -> str:
        return files.get((kind, ref)) or store.resolve_seed(kind, ref).hash

    harness = store.get_asset("harness", pin("harness", a.harness))
    rubric = store.get_asset("rubric", pin("rubric", a.rubric)) if a.rubric else None
    library, skills = (store.get_library(pin("skill_library", a.skill_library))
                       if a.skill_library else (None, []))
    return Incumbent(harness=harness, library=library, skills=skills, rubric=rubric)


def restore_incumbent(store: Any, hashes: dict[str, str | None]) -> Incumbent:
    """An Incumbent from stored hashes (what a finished round's summary records)."""
    library, skills = store.get_library(hashes["skill_library"]) if hashes.get("skill_library") else (None, [])
    return Incumbent(harness=store.get_asset("harness", hashes["harness"]), library=library,
                     skills=skills, checkpoint=hashes.get("checkpoint"),
                     rubric=store.get_asset("rubric", hashes["rubric"]) if hashes.get("rubric") else None)


def incumbent_at(run: _Run, seed: dict[str, str | None]) -> tuple[Incumbent, int]:
    """Skip finished rounds: the incumbent after the last done round, and the next index."""
    hashes, start = seed, 0
    for rec in run.store.rounds(run.id):
        if rec.status != "done":
            break
        hashes, start = rec.summary["incumbent"], rec.index + 1
        if rec.summary.get("stop"):
            start = run.cfg.rounds  # the run stopped early; only the final evaluation is left
    return restore_incumbent(run.store, hashes), start


def begin_round(run: _Run, r: int) -> None:
    have = {x.index: x for x in run.store.rounds(run.id)}
    if r not in have:
        run.store.start_round(run.id, r)
    run.progress(f"round {r}: {'resuming' if r in have else 'started'}")


def end_round(run: _Run, r: int, incumbent: Incumbent, accepted: list[Candidate]) -> str | None:
    """Close round r with the incumbent's hashes; returns why the run stops now (or None)."""
    stop = why_stop(run, r, incumbent, accepted)  # coevo/stoprules.py
    summary = {**run.store.get_round(run.id, r).summary, **track_score(run, r, incumbent, "val"),
               "incumbent": incumbent.hashes(), "accepted": [c.hash for c in accepted],
               "spent": run.store.budget_totals(run.id, round=r), "stop": stop}
    run.store.finish_round(run.id, r, "done", summary=summary)
    run.observer.round_done(r)
    run.progress(f"round {r}: done, {len(accepted)} accepted" + (f"; stopping: {stop}" if stop else ""))
    return stop


# --- the stages ----------------------------------------------------------------------------------


def rl_step(run: _Run, r: int, incumbent: Incumbent, *, stage: Any = None,
            harness_for: Callable[[int, Any], Any] | None = None) -> Incumbent:
    """The round's RL stage (harness-only: none); returns the incumbent with checkpoint C.
    `stage`: another StageConfig than rl.stage; `harness_for(step, task)`: each group's
    harness (fst: drawn from its Pareto front; default: the incumbent's)."""
    if not run.mode.train:
        collect_train_rollouts(run, r, incumbent)  # the proposers still need trajectories
        return incumbent
    from coevo.rl.stage import rl_stage

    p, stage = run.parts, stage or run.cfg.rl.stage
    steps = stage.steps
    run.count(f"round {r}: RL steps", 0, steps)  # log_rl_step counts each step
    res = rl_stage(run.store, run.id, r, p.env, incumbent.agent_assets(), p.trainer,
                   stage, tokenizer=p.tokenizer, resume=True, backend=p.rl_backend,
                   on_step=lambda e: log_rl_step(run, r, e), judge=run.judge,
                   harness_for=harness_for)
    run.count(f"round {r}: RL steps", steps, steps)  # also when a resumed stage had none left
    if p.live_eval and res.checkpoint is not None:
        p.backend.adapter = run.store.get_checkpoint(res.checkpoint).path  # already in memory
    run.progress(f"round {r}: RL steps {res.start_step}..{res.end_step}, checkpoint {res.checkpoint}")
    return incumbent.with_checkpoint(res.checkpoint)


def log_rl_step(run: _Run, r: int, entry: Any) -> None:
    """Append an RL step's log (reward, signal fraction, loss, KL, checkpoint) to the running
    round's summary as it happens, so a crashed stage keeps the steps it did (keyed by step:
    a redone step replaces its entry), and count it."""
    run.count(f"round {r}: RL steps", entry.index, entry.of)
    summary = run.store.get_round(run.id, r).summary
    steps = [x for x in summary.get("rl_steps", []) if x.get("step") != entry.step]
    update = {"rl_steps": [*steps, entry.model_dump(mode="json")]}
    if entry.checkpoint:
        update["checkpoint"] = entry.checkpoint
        update["checkpoints"] = [*summary.get("checkpoints", []), entry.checkpoint]
    run.store.finish_round(run.id, r, "running", summary={**summary, **update})
    run.observer.rl_step(r, entry)


def collect_train_rollouts(run: _Run, r: int, incumbent: Incumbent) -> None:
    """Harness-only mode: roll the incumbent out on a seeded sample of train tasks (stored with
    the round, like the RL stage's rollouts). Idempotent: skipped when the round has them."""
    if not run.mode.propose or run.store.trajectories(run.id, round=r, split="train", limit=1):
        return
    pool = list(run.parts.env.tasks("train"))
    n = min(run.cfg.splits.train_n or 16, len(pool))
    tasks = random.Random(f"{run.cfg.seed}:{r}").sample(pool, n)
    k = run.key("train", r)
    evaluate(run.store, run.parts.env, incumbent.agent_assets(), run.parts.backend,
             tasks=tasks, split="train", samples=run.cfg.splits.train_samples,
             seed=run.cfg.seed + r, run=run.id, round=r, judge=run.judge, key=k,
             on_stored=lambda res: run.store.charge(run.id, eval_charge(res), round=r, key=k),
             progress=run.counter(f"round {r}: train rollouts"))


def propose_step(run: _Run, r: int, incumbent: Incumbent,
                 trajs: list[Any]) -> list[tuple[str, Candidate, str]]:
    """Candidates of round r as (proposal id, candidate, status). Stored in one transaction;
    a resumed round reloads them instead of proposing again."""
    if not run.mode.propose:
        return []
    stored = run.store.proposals(run.id, round=r)
    if stored:
        return [(p.id, stored_candidate(run.store, p), p.status) for p in stored]
    held = run.store.awaiting_review(run.id) if run.cfg.gate.human_review else []
    if held:  # revising an incumbent a review may still change would waste the proposals
        run.progress(f"round {r}: RL only, {len(held)} candidate(s) await review")
        return []
    harnesses = {h: run.store.get_asset("harness", h) for h in {t.harness for t in trajs if t.harness}}
    ctx = ProposalContext(run=run.id, round=r, incumbent=incumbent, trajectories=trajs,
                          imported=imported_traces(run.store, run.parts.env.name),
                          harnesses=harnesses, feedback=verifier_feedback(run.parts.env, trajs),
                          seed=run.cfg.seed + r)
    cands: list[Candidate] = []
    costs: list[dict[str, float]] = []
    for proposer in run.parts.proposers:
        t0 = time.perf_counter()
        cands.extend(proposer.propose(ctx))
        # What the proposer spent (model calls, tokens, episodes of its own), as it reports
        # in `last_cost`; a proposer without one (demos) called no model and costs nothing.
        costs.append({**(getattr(proposer, "last_cost", None) or {}),
                      "seconds": time.perf_counter() - t0})
    out = []
    with run.store.transaction():  # the charges with the proposals: a resume redoes neither
        for k, (proposer, cost) in enumerate(zip(run.parts.proposers, costs)):
            run.store.charge(run.id, cost, round=r, key=f"propose:{r}:{k}:{proposer.name}")
        for cand in dedupe(cands):
            out.append(_record_proposal(run, r, incumbent, cand))
    run.progress(f"round {r}: {len(out)} proposals, "
                 f"{sum(s == 'invalid' for _, _, s in out)} invalid")
    return out


def _record_proposal(run: _Run, r: int, incumbent: Incumbent,
                     cand: Candidate) -> tuple[str, Candidate, str]:
    reason = check_candidate(cand, incumbent)
    old = incumbent.asset(cand.kind)
    changes = asset_diff(old, cand.asset) if cand.asset is not None and old is not None \
        and old.kind == cand.asset.kind else {}
    if reason is None:
        for skill in cand.skills:  # members first: the library row refers to them
            run.store.put_asset(skill)
    # An invalid candidate's asset is not stored as a version (name lookups would find it);
    # its content stays auditable in raw_output and the field diff.
    raw = cand.raw_output or (cand.asset.canonical() if cand.asset is not None and reason else "")
    pid = run.store.add_proposal(
        proposer=cand.proposer, kind=cand.kind, parent=old.hash if old is not None else None,
        candidate=cand.asset if reason is None else None, run=run.id, round=r,
        status="invalid" if reason else "pending", rationale=cand.rationale,
        predicted_effect=cand.predicted_effect, prompt=cand.prompt, raw_output=raw,
        error=reason, diff=changes, model=cand.model, edits=cand.edits)
    return pid, cand, "invalid" if reason else "pending"


def final_step(run: _Run, incumbent: Incumbent) -> EvalResult | None:
    """The final incumbent on the test split, once (a resumed finished run reuses it)."""
    store, last = run.store, max((x.index for x in run.store.rounds(run.id)), default=None)
    summary = store.get_round(run.id, last).summary if last is not None else {}
    if not run.cfg.final_test or last is None:
        store.set_run_status(run.id, "done")
        return None
    if summary.get("final_evaluation"):
        store.set_run_status(run.id, "done")
        rec = store.get_evaluation(summary["final_evaluation"])
        return EvalResult.model_validate({**rec.summary, "evaluation": rec.id})
    tasks = list(run.parts.env.tasks("test", run.cfg.splits.test_n))
    res = evaluate(store, run.parts.env, incumbent.agent_assets(), run.parts.backend, tasks=tasks,
                   split="test", samples=run.cfg.splits.test_samples, seed=run.cfg.seed,
                   checkpoint=incumbent.checkpoint, run=run.id, judge=run.judge,
                   key=run.key("final", incumbent.hashes()),  # a run extended later is tested anew
                   progress=run.counter("final: test"))
    with store.transaction():
        store.finish_round(run.id, last, "done", summary={
            **summary, "final_evaluation": res.evaluation, "test_score": res.mean,
            "test_ci": [res.ci_low, res.ci_high],
            "evaluations": {**summary.get("evaluations", {}), "test": res.evaluation}})
        store.set_run_status(run.id, "done")
    run.progress(f"final: {res.line()}")
    return res
