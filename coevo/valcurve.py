"""The val curve: the incumbent's score on the whole val split at the start of the run and
after each round (and, with `splits.seed_test`, the seed on the test split), stored in the
rounds' summaries. A measurement for the report and the quickstart's before / after: it never
feeds a decision and is charged apart from the budgets the modes are matched on."""

from __future__ import annotations

from typing import Any

from coevo.evaluate import EvalResult, evaluate


def track_score(run: Any, r: int, incumbent: Any, key: str,
                split: str = "val") -> dict[str, Any]:
    """The incumbent's score on the whole val split, or with split="test" on the test split
    (the val curve of the report and the quickstart's before/after), stored in round r's
    summary as `<key>_score` and `evaluations[key]`. Measurement, not part of the algorithm:
    it uses the loop's fixed seed (the same per-task seeds every round, so rounds compare),
    never feeds a decision, and is charged as `eval_rollouts`, apart from the budgets the
    modes are matched on.
    Idempotent: the evaluation id is written to the running round before anything else, so
    a resumed round reuses it. The test split is scored this way only by `splits.seed_test`.
    Unchanged incumbent: a val evaluation of this run with the same incumbent (assets and
    checkpoint) is the same measurement (same tasks, seeds and weights) and is reused, not
    rerun: a round that accepted nothing and trained no new checkpoint (harness-only) repeats
    the previous round's score at no cost."""
    sp = run.cfg.splits
    if split == "val" and not sp.track_val:
        return {}
    summary = run.store.get_round(run.id, r).summary
    evs = dict(summary.get("evaluations") or {})
    same = None if key in evs or split != "val" else earlier_val(run, r, incumbent)
    if key in evs:
        rec = run.store.get_evaluation(evs[key])
        res = EvalResult.model_validate({**rec.summary, "evaluation": rec.id})
    elif same is not None:
        res = same
        evs[key] = res.evaluation
        run.store.finish_round(run.id, r, "running", summary={
            **summary, "evaluations": evs, f"{key}_incumbent": incumbent.hashes(),
            f"{key}_score": res.mean, f"{key}_ci": [res.ci_low, res.ci_high]})
        run.progress(f"round {r}: {key} {res.line()} (the same incumbent's, reused)")
    else:
        k = run.key("track", r, key)
        tasks = run.val if split == "val" else list(run.parts.env.tasks("test", sp.test_n))
        res = evaluate(run.store, run.parts.env, incumbent.agent_assets(), run.parts.backend,
                       tasks=tasks, split=split,
                       samples=sp.val_samples if split == "val" else sp.test_samples,
                       seed=run.cfg.seed, checkpoint=incumbent.checkpoint, run=run.id, round=r,
                       judge=run.judge, key=k, on_stored=lambda res: run.store.add_budget(
                           run.id, "eval_rollouts", res.n_episodes, round=r, key=k),
                       progress=run.counter(f"round {r}: {key.replace('_', ' ')}"))
        evs[key] = res.evaluation
        with run.store.transaction():
            run.store.finish_round(run.id, r, "running", summary={
                **summary, "evaluations": evs, f"{key}_score": res.mean,
                f"{key}_ci": [res.ci_low, res.ci_high],
                **({f"{key}_incumbent": incumbent.hashes()} if split == "val" else {})})
        run.progress(f"round {r}: {key} {res.line()}")
    return {"evaluations": evs, f"{key}_score": res.mean, f"{key}_ci": [res.ci_low, res.ci_high]}


def earlier_val(run: Any, r: int, incumbent: Any) -> EvalResult | None:
    """A val evaluation this run already made of `incumbent` (same asset versions and
    checkpoint), in round r or before, or None. Read from the rounds' summaries: each val
    evaluation's incumbent (`<key>_incumbent`; for a finished round's "val", its `incumbent`)."""
    want = incumbent.hashes()
    for x in sorted(run.store.rounds(run.id), key=lambda x: -x.index):
        if x.index > r:
            continue
        s, evs = x.summary, x.summary.get("evaluations") or {}
        for key in ("val", "val_start"):
            who = s.get(f"{key}_incumbent") or (s.get("incumbent") if key == "val" and
                                                x.status == "done" else None)
            if key in evs and who == want:
                rec = run.store.get_evaluation(evs[key])
                return EvalResult.model_validate({**rec.summary, "evaluation": rec.id})
    return None
