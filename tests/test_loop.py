"""The co-evolution loop end to end on CPU: a tiny random Llama trained by the real RL stage,
a scripted policy backend whose reply depends on the system prompt (so a harness revision can
truly help), the real gate, evaluate() and store. (RunConfig loading: tests/test_config.py.)

`build()` is reused by tests/test_resume.py (in a subprocess), so it takes only plain values.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from coevo.assets.harness import Harness
from coevo.config import RunConfig
from coevo.errors import CoevoError
from coevo.loop import Parts, run_coevolution
from coevo.models.scripted import ScriptedBackend
from coevo.propose import make_proposer
from coevo.store import Store

HINT = "Begin with the letter a."
HELPS = {"kind": "harness", "changes": {"system_prompt": f"Reply briefly.\n{HINT}"},
         "rationale": "the verifier wants a first letter in a-m", "predicted_effect": "+100pp"}
NO_EFFECT = {"kind": "harness", "changes": {"answer_format": "Be kind."}, "rationale": "style"}
FORBIDDEN = {"kind": "harness", "changes": {"name": "renamed"}, "rationale": "rename"}
BROKEN = {"kind": "harness", "changes": {"decoding": {"temperature": 9.0}}, "rationale": "hot"}


class ScriptedPolicy(ScriptedBackend):
    """Replies "a ..." (scored 1 by FirstCharEnv) iff the system prompt carries HINT, else
    "zz" (scored 0). It records the adapter folders evaluate() asks it to load, so a test can
    check that both gate arms ran under the round's checkpoint."""

    def __init__(self, tokenizer):
        super().__init__(self._reply, tokenizer, name="scripted-policy")
        self.adapter: str | None = None
        self.loaded: list[str] = []

    def _reply(self, request, index):
        # The runtime sends the exact prompt token ids; read the system prompt back from them.
        prompt = (self.tokenizer.decode(request.prompt_ids) if request.prompt_ids is not None
                  else str(request.messages))
        return "a fine" if HINT in prompt else "zz"

    def load_adapter(self, path):
        self.adapter = str(path)
        self.loaded.append(str(path))


def config(tmp: str | Path, mode: str = "gated", candidates=(HELPS, NO_EFFECT), rounds: int = 1,
           **extra) -> RunConfig:
    data = {
        "name": extra.pop("name", f"run-{mode}"), "env": "test:first-char", "mode": mode,
        "rounds": rounds, "assets": {"harness": "tiny"},
        "rl": {"stage": {"steps": 1, "tasks_per_step": 2, "samples": 2, "checkpoint_every": 1,
                         "checkpoint_dir": str(Path(tmp) / "ckpt")},
               "train": {"lr": 1e-2, "lora": {"rank": 2, "alpha": 4.0,
                                              "target_modules": ["q_proj", "v_proj"]}}},
        "proposers": [{"name": "scripted", "options": {"candidates": list(candidates)}}],
        "gate": {"screen_size": 12, "n_boot": 200},
        "splits": {"val_n": 12, "test_n": 6, "train_n": 4},
    }
    data.update(extra)
    return RunConfig.from_mapping(data)


def build(tmp: str | Path, cfg: RunConfig, url: str):
    """(store, parts) for `cfg`: the tiny Llama trainer, the scripted policy, FirstCharEnv."""
    import tiny_glue

    from coevo.rl.trainer import Trainer

    store = Store.open(url)
    store.put_asset(tiny_glue.tiny_harness(decoding={"temperature": 1.0, "max_new_tokens": 8}))
    tok = tiny_glue.tiny_tokenizer()
    policy = ScriptedPolicy(tok)
    env = tiny_glue.FirstCharEnv(target="abcdefghijklm", size=12)  # "zz" fails, "a fine" passes
    proposers = [make_proposer(p.name, **p.options) for p in cfg.proposers]
    trainer = None
    if cfg.mode != "harness-only":
        model, _ = tiny_glue.load_tiny_model(tiny_glue.save_tiny_model(Path(tmp) / "tiny"))
        trainer = Trainer(model, cfg.rl.train, base_model="tiny")
    return store, Parts(env=env, backend=policy, proposers=proposers, trainer=trainer,
                        tokenizer=tok, rl_backend=policy)


def _run(tmp_path, mode="gated", candidates=(HELPS, NO_EFFECT), **kw):
    cfg = config(tmp_path, mode, candidates, **kw)
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'loop.db'}")
    return cfg, store, parts, run_coevolution(cfg, store, parts)


def _by_rationale(store, run):
    return {p.rationale: p for p in store.proposals(run)}


def test_gated_accepts_the_helpful_candidate_and_rejects_the_other(tmp_path):
    cfg, store, parts, res = _run(tmp_path)
    props = _by_rationale(store, res.run)
    helps, style = props[HELPS["rationale"]], props[NO_EFFECT["rationale"]]
    assert (helps.status, style.status) == ("accepted", "rejected")
    d_help, d_style = store.decisions(helps.id)[0], store.decisions(style.id)[0]
    assert d_help.accepted and d_help.policy == "paired" and "Holm over 2" in d_help.reason
    # 12 paired wins under the same checkpoint: every evidence row is 0 -> 1.
    assert len(d_help.evidence) == 12
    assert {(e.incumbent, e.candidate) for e in d_help.evidence} == {(0.0, 1.0)}
    assert {(e.incumbent, e.candidate) for e in d_style.evidence} == {(0.0, 0.0)}
    assert d_help.statistic["p_adjusted"] < cfg.gate.alpha < d_style.statistic["p_adjusted"]
    # The incumbent moved to the accepted version; its parent is the seed harness.
    final_h = store.get_asset("harness", res.incumbent["harness"])
    assert HINT in final_h.system_prompt and final_h.parent == helps.parent
    # RL ran (one checkpoint), both arms were scored under it, the test split once at the end.
    ck = store.latest_checkpoint(res.run)
    assert ck is not None and res.incumbent["checkpoint"] == ck.id
    assert set(parts.backend.loaded) <= {ck.path} and parts.backend.adapter == ck.path
    assert res.final is not None and res.final.split == "test" and res.final.mean == 1.0
    assert res.final.checkpoint == ck.id and res.final.harness == final_h.hash
    assert store.get_run(res.run).status == "done"
    # Gate evaluations are val; the train trajectories come from the RL stage.
    assert {t.split for t in store.trajectories(res.run, round=0)} == {"train", "val"}


def test_ungated_accepts_every_valid_candidate_without_evaluating(tmp_path):
    _, store, _, res = _run(tmp_path, "ungated")
    props = store.proposals(res.run)
    assert [p.status for p in props] == ["accepted", "accepted"]
    assert all(store.decisions(p.id)[0].policy == "ungated" for p in props)
    assert not any(store.decisions(p.id)[0].evidence for p in props)  # nothing was gated
    # The only val episodes are the val-curve measurements (seed, end of round 0), charged
    # apart from the gate's budget.
    assert len(store.trajectories(res.run, split="val")) == 2 * 12
    assert store.budget_totals(res.run)["eval_rollouts"] == 2 * 12
    # Two harness children of one parent: the later one is what the incumbent keeps.
    assert res.incumbent["harness"] == props[-1].candidate


def test_weight_only_makes_no_proposals(tmp_path):
    _, store, _, res = _run(tmp_path, "weight-only")
    assert store.proposals(res.run) == []
    assert store.latest_checkpoint(res.run) is not None
    assert res.incumbent["harness"] == store.get_run(res.run).config["seed"]["harness"]


def test_harness_only_runs_no_rl_stage(tmp_path):
    _, store, _, res = _run(tmp_path, "harness-only")
    assert store.latest_checkpoint(res.run) is None and res.incumbent["checkpoint"] is None
    assert [p.status for p in store.proposals(res.run)] == ["accepted", "rejected"]
    # The proposers still got train trajectories: rolled out by the loop, not by RL.
    train = store.trajectories(res.run, round=0, split="train")
    assert len(train) == 4 * 2 and all(t.checkpoint is None for t in train)


def test_invalid_candidates_are_stored_with_the_reason_and_never_gated(tmp_path):
    _, store, _, res = _run(tmp_path, "harness-only", candidates=(FORBIDDEN, BROKEN, HELPS))
    props = _by_rationale(store, res.run)
    bad, broken = props["rename"], props["hot"]
    assert bad.status == broken.status == "invalid"
    assert "outside the harness whitelist: name" in bad.error and bad.candidate is None
    assert "decoding.temperature" in broken.error
    assert store.decisions(bad.id) == [] and store.decisions(broken.id) == []
    # Holm counted only the gated candidate.
    assert "Holm over 1" in store.decisions(props[HELPS["rationale"]].id)[0].reason


def test_test_split_never_reaches_the_gate(tmp_path):
    """An environment whose val split leaks a test task: the gate's test_guard refuses it."""
    import tiny_glue

    class Leaky(tiny_glue.FirstCharEnv):
        def tasks(self, split="train", n=None):
            out = super().tasks(split, n)
            if split == "val":  # smuggle the first test task into validation
                out = out[:-1] + super().tasks("test", 1)
            return out

    cfg = config(tmp_path, "harness-only")
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'leak.db'}")
    parts.env = Leaky(size=12)
    with pytest.raises(CoevoError, match="test_guard"):
        run_coevolution(cfg, store, parts)
    assert store.trajectories(split="test") == []


def test_two_rounds_carry_the_incumbent_and_chain_checkpoints(tmp_path):
    round1 = {**NO_EFFECT, "round": 1, "rationale": "round-1 style"}
    _, store, _, res = _run(tmp_path, candidates=(HELPS, round1), rounds=2)
    rounds = store.rounds(res.run)
    assert [r.status for r in rounds] == ["done", "done"]
    assert rounds[0].summary["incumbent"]["harness"] == rounds[1].summary["incumbent"]["harness"]
    props = _by_rationale(store, res.run)
    assert props["round-1 style"].parent == rounds[0].summary["incumbent"]["harness"]
    c1 = store.get_checkpoint(rounds[1].summary["incumbent"]["checkpoint"])
    assert c1.round == 1 and c1.parent == rounds[0].summary["incumbent"]["checkpoint"]


def test_existing_run_name_needs_resume(tmp_path):
    cfg, store, parts, res = _run(tmp_path, "harness-only")
    with pytest.raises(CoevoError, match="--resume"):
        run_coevolution(cfg, store, parts)
    again = run_coevolution(cfg, store, parts, resume=cfg.name)  # finished: nothing redone
    assert again.final.evaluation == res.final.evaluation
    with pytest.raises(CoevoError, match="differs from the run's in gate"):
        run_coevolution(config(tmp_path, "harness-only", gate={"alpha": 0.1}), store, parts,
                        resume=cfg.name)


def test_seed_test_scores_the_seed_on_the_final_tests_tasks(tmp_path):
    """splits.seed_test: round 0 also scores the seed incumbent (seed harness, no checkpoint)
    on the test split, on the tasks and seeds the final test uses, so the two pair per task."""
    from coevo.evaluate import paired_difference, task_outcomes

    cfg, store, _, res = _run(tmp_path, splits={"val_n": 12, "test_n": 6, "train_n": 4,
                                                "seed_test": True})
    [r0] = store.rounds(res.run)
    rec = store.get_evaluation(r0.summary["evaluations"]["test_start"])
    seed, final = task_outcomes(rec), task_outcomes(store.get_evaluation(res.final.evaluation))
    assert rec.split == "test" and rec.checkpoint is None
    assert rec.harness == store.get_run(res.run).config["seed"]["harness"] != res.final.harness
    assert sorted(seed) == sorted(final) and len(seed) == 6
    assert (r0.summary["test_start_score"], res.final.mean) == (0.0, 1.0)
    assert set(seed.values()) == {0.0} and set(final.values()) == {1.0}
    assert paired_difference(final, seed) == (1.0, 1.0, 1.0, 6)
    # off by default: nothing is evaluated on the test split before the end
    _, store2, _, res2 = _run(tmp_path / "off")
    assert "test_start" not in store2.rounds(res2.run)[0].summary["evaluations"]


def test_rounds_record_the_val_curve_and_rl_steps(tmp_path):
    """Seed score before round 0, the incumbent's score after each round, the RL step logs
    (reward, signal fraction) and the test score: what `coevo runs show` and the report read."""
    _, store, _, res = _run(tmp_path, "gated")
    [r0] = store.rounds(res.run)
    s = r0.summary
    # The seed harness scores 0 (no HINT); the accepted revision scores 1 on every val task.
    assert s["val_start_score"] == 0.0 and s["val_score"] == 1.0
    assert set(s["evaluations"]) == {"val_start", "val", "test"}
    assert store.get_evaluation(s["evaluations"]["val"]).harness == res.incumbent["harness"]
    assert s["test_score"] == res.final.mean == 1.0
    [step] = s["rl_steps"]
    assert step["step"] == 1 and 0.0 <= step["signal_fraction"] <= 1.0
    assert s["checkpoint"] == res.incumbent["checkpoint"] == s["checkpoints"][-1]
    from coevo.audit import round_rows

    [row] = round_rows(store, res.run)
    assert row.val_score == 1.0 and row.test_score == 1.0


class ParityPolicy(ScriptedPolicy):
    """Passes the even tasks ("a fine") and fails the odd ones ("zz"), whatever the harness:
    the val split has both outcomes, so a rubric's predictive validity can be measured."""

    def _reply(self, request, index):
        import re

        prompt = self.tokenizer.decode(request.prompt_ids)
        n = int(re.findall(r"about (\d+)\.", prompt)[-1])
        return "a fine" if n % 2 == 0 else "zz"


def _rubric_cand(cid: str, pattern: str) -> dict:
    return {"kind": "rubric", "rationale": f"pay for {pattern!r}", "changes": {"criteria": [
        {"id": cid, "kind": "regex", "weight": 1.0, "params": {"pattern": pattern}}]}}


def test_rubric_candidates_are_gated_on_predictive_validity_not_their_own_scores(tmp_path):
    """Incumbent rubric: pays any word character (uninformative). Candidate A pays a leading
    'a' (exactly the verified successes); candidate B pays 'z' (exactly the failures, and it
    would score the policy's current outputs HIGHER than A on half the tasks). Validity
    accepts A, rejects B, and spends only incumbent episodes."""
    from coevo.assets.rubric import Rubric

    good, bad = _rubric_cand("leading-a", "^a"), _rubric_cand("has-z", "z")
    cfg = config(tmp_path, "harness-only", candidates=(good, bad), rounds=1,
                 assets={"harness": "tiny", "rubric": "flat"}, splits={"val_n": 12, "test_n": 4, "train_n": 4})
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'loop.db'}")
    store.put_asset(Rubric.model_validate({"name": "flat", "outcome_weight": 1.0, "criteria": [
        {"id": "wordy", "kind": "regex", "params": {"pattern": "\\w"}}]}))
    parts.backend = parts.rl_backend = ParityPolicy(parts.tokenizer)
    res = run_coevolution(cfg, store, parts)
    props = _by_rationale(store, res.run)
    d_good = store.decisions(props[good["rationale"]].id)[0]
    d_bad = store.decisions(props[bad["rationale"]].id)[0]
    assert d_good.policy == d_bad.policy == "validity"
    assert d_good.accepted and not d_bad.accepted
    assert d_good.statistic["auc_candidate"] == 1.0 and d_good.statistic["auc_incumbent"] == 0.5
    assert d_bad.statistic["auc_candidate"] == 0.0
    # Evidence: one row per val episode of the incumbent, partial scores of both rubrics.
    assert len(d_good.evidence) == 12
    assert {(e.incumbent, e.candidate) for e in d_good.evidence} == {(1.0, 1.0), (1.0, 0.0)}
    final = store.get_asset("rubric", res.incumbent["rubric"])
    assert [c.id for c in final.criteria] == ["leading-a"]
    # The second rubric candidate reused the first's incumbent episodes: 12 val episodes for
    # the gate, no candidate arm at all (+ the val-curve measurements).
    gate_val = store.budget_totals(res.run, round=0)["rollouts"] - 4 * cfg.splits.train_samples
    assert gate_val == 12


def test_soft_gate_scores_are_the_reward_over_its_maximum():
    """A successful episode's reward is outcome_weight + partial (up to 2): the soft gate
    must see it as 1.0, not drop it as out of range."""
    from coevo.assets.rubric import Rubric
    from coevo.gatestep import unit_reward as _unit

    r = Rubric.model_validate({"name": "r", "outcome_weight": 1.0, "criteria": [
        {"id": "named", "kind": "tool_called", "params": {"name_in_offered": True}}]})
    assert _unit(2.0, r) == 1.0 and _unit(0.5, r) == 0.25 and _unit(0.0, r) == 0.0
    assert _unit(1.0, None) == 1.0 and _unit(None, r) is None


def test_a_second_run_in_the_store_starts_from_the_seed_files(tmp_path):
    """Two runs in one store: the first accepts a revision of harness "tiny"; the second,
    configured with the same name and seed folder, starts from the seed file's version, not
    from what the first run accepted (the bench puts every run in one store)."""
    from coevo.assets.io import asset_path, dump_asset, load_asset

    seed = tiny_glue_harness()
    seeds = tmp_path / "seeds"
    path = dump_asset(seed, asset_path(seeds, seed))
    file_hash = load_asset(path).hash
    cfg = config(tmp_path, "harness-only", name="first",
                 assets={"harness": "tiny", "seed_dir": str(seeds)})
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'two.db'}")
    first = run_coevolution(cfg, store, parts)
    accepted = first.incumbent["harness"]
    assert accepted != file_hash and store.get_asset("harness", "tiny").hash == accepted
    second = config(tmp_path, "harness-only", name="second",
                    assets={"harness": "tiny", "seed_dir": str(seeds)})
    res = run_coevolution(second, store, parts)
    seed_hashes = store.get_run(res.run).config["seed"]
    assert seed_hashes["harness"] == file_hash == store.get_run(first.run).config["seed"]["harness"]
    # Without a seed folder the store's seed version is used; name@hash pins any version.
    third = config(tmp_path, "harness-only", name="third", assets={"harness": "tiny"})
    assert run_coevolution(third, store, parts).rounds[0]["val_start_score"] == 0.0
    assert store.get_run("third").config["seed"]["harness"] == file_hash
    fourth = config(tmp_path, "harness-only", name="fourth",
                    assets={"harness": f"tiny@{accepted[:12]}"})
    run_coevolution(fourth, store, parts)
    assert store.get_run("fourth").config["seed"]["harness"] == accepted


def tiny_glue_harness():
    import tiny_glue

    return tiny_glue.tiny_harness(decoding={"temperature": 1.0, "max_new_tokens": 8})


class WinnersPolicy(ScriptedPolicy):
    """With HINT in the prompt, passes the val tasks numbered in `winners`; without it, fails
    every task: a helpful candidate wins on those tasks and ties on the rest."""

    def __init__(self, tokenizer, winners):
        super().__init__(tokenizer)
        self.winners = set(winners)

    def _reply(self, request, index):
        import re

        prompt = self.tokenizer.decode(request.prompt_ids)
        n = int(re.findall(r"about (\d+)\.", prompt)[-1])
        return "a fine" if HINT in prompt and n in self.winners else "zz"


def test_sequential_stops_agree_with_holm_over_the_round(tmp_path):
    """Three candidates, one helpful (28 wins, 0 losses, 12 ties on 40 val tasks). Stopping
    its comparison at the unadjusted level (21 wins, 0 losses, 10 tasks left: worst-case
    p = 0.035) and applying Holm afterwards (3 x 0.035 > 0.05) rejected it, though the full
    evaluation with Holm accepts it (p = 2^-28). Curtailing at alpha/3 it runs on, and the
    stored decision cites the stage it stopped at."""
    import tiny_glue

    style2 = {**NO_EFFECT, "changes": {"answer_format": "Be brief."}, "rationale": "style 2"}
    cfg = config(tmp_path, "harness-only", candidates=(HELPS, NO_EFFECT, style2),
                 gate={"screen_size": 10, "chunk_size": 10, "n_boot": 200},
                 splits={"val_n": 40, "test_n": 4, "train_n": 4})
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'holm.db'}")
    parts.env = tiny_glue.FirstCharEnv(target="abcdefghijklm", size=40)
    # The gate evaluates the val tasks in an order shuffled by gate.seed: the helpful
    # candidate wins the first 21 of them and 7 of the last 10.
    import random

    order = list(range(40))
    random.Random(cfg.gate.seed).shuffle(order)
    parts.backend = parts.rl_backend = WinnersPolicy(parts.tokenizer, order[:21] + order[30:37])
    res = run_coevolution(cfg, store, parts)
    props = _by_rationale(store, res.run)
    [d] = store.decisions(props[HELPS["rationale"]].id)
    assert d.accepted, d.reason
    assert "Holm over 3" in d.reason
    wins = sum(e.candidate == 1.0 and e.incumbent == 0.0 for e in d.evidence)
    assert (wins, len(d.evidence)) == (28, 40)
    assert d.statistic["p_adjusted"] == pytest.approx(3 * 2.0**-28, rel=1e-3)
    last = d.stages[-1]
    assert [s["name"] for s in d.stages] == ["screen", "chunk 1", "chunk 2", "chunk 3"]
    assert last["action"] == "accept" and last["tasks_total"] == 40 and d.metric == "outcome"
    assert f"stopped at {last['name']} after 40/40 tasks: {last['rule']}" in d.reason
    for other in (NO_EFFECT, style2):
        assert props[other["rationale"]].status == "rejected"


def test_gate_arms_sample_with_the_gates_per_task_seeds(tmp_path):
    """Both arms of every comparison sample task t, sample s with the gate's own seed
    seed_for(t, s, seed + round), the seed the gate's evidence is keyed on."""
    from coevo.sequential import seed_for

    cfg, store, _, res = _run(tmp_path, "harness-only", splits={"val_n": 12, "test_n": 6,
                                                                "train_n": 4, "val_samples": 2})
    [r0] = store.rounds(res.run)
    tracked = set(r0.summary["evaluations"].values())
    gate = [t for t in store.trajectories(res.run, round=0, split="val")
            if t.id not in {x.id for e in tracked for x in store.trajectories(evaluation=e)}]
    assert {t.sample_index for t in gate} == {0, 1} and len(gate) == 3 * 2 * 12  # 3 arms
    assert all(t.seed == seed_for(t.task_id, t.sample_index, cfg.seed) for t in gate)
    d = store.decisions(_by_rationale(store, res.run)[HELPS["rationale"]].id)[0]
    assert {(e.task_id, e.sample) for e in d.evidence} == {(t.task_id, t.sample_index) for t in gate}


def test_the_test_split_guard_covers_every_test_task(tmp_path):
    """A val split that leaks a test task past the first test_n: still refused by the gate."""
    import tiny_glue

    class LateLeak(tiny_glue.FirstCharEnv):
        def tasks(self, split="train", n=None):
            out = super().tasks(split, n)
            if split == "val":  # the LAST test task, which the final evaluation never uses
                out = out[:-1] + super().tasks("test")[-1:]
            return out

    cfg = config(tmp_path, "harness-only")
    assert cfg.splits.test_n == 6
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'late.db'}")
    parts.env = LateLeak(size=12)
    with pytest.raises(CoevoError, match="test_guard"):
        run_coevolution(cfg, store, parts)


def test_soft_gate_decisions_store_the_metric_they_decided_on(tmp_path):
    """The soft gate decides on partial credit: the evidence rows hold both arms' partial
    credit (the reward over its maximum, as the trajectories' rewards give it), the decision
    names the metric, and its stage records say where and why the comparison stopped."""
    from coevo.assets.rubric import Rubric
    from coevo.gatestep import unit_reward

    cfg = config(tmp_path, "harness-only", gate={"name": "soft", "screen_size": 12, "n_boot": 200},
                 assets={"harness": "tiny", "rubric": "short"})
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'soft.db'}")
    rubric = Rubric.model_validate({"name": "short", "outcome_weight": 1.0, "criteria": [
        {"id": "short", "kind": "outcome", "params": {"detail": "short"}}]})
    store.put_asset(rubric)
    res = run_coevolution(cfg, store, parts)
    props = _by_rationale(store, res.run)
    [d] = store.decisions(props[HELPS["rationale"]].id)
    assert d.policy == "soft" and d.metric == "partial" and d.accepted
    by_arm = {t.harness: {x.task_id: unit_reward(x.reward, rubric) for x in
                          store.trajectories(res.run, split="val") if x.harness == t.harness}
              for t in store.trajectories(res.run, split="val")}
    seed_h, cand_h = props[HELPS["rationale"]].parent, props[HELPS["rationale"]].candidate
    assert len(d.evidence) == 12
    for e in d.evidence:
        assert e.incumbent_partial == by_arm[seed_h][e.task_id] == 0.5  # "zz": short, failed
        assert e.candidate_partial == by_arm[cand_h][e.task_id] == 1.0  # "a fine": both
        assert (e.incumbent, e.candidate) == (0.0, 1.0)
    [stage] = d.stages
    assert (stage["name"], stage["wins"], stage["action"]) == ("screen", 12, "accept")
    assert stage["rule"] in d.reason


def test_a_rubric_candidate_that_zeroes_the_outcome_is_invalid(tmp_path):
    """The candidate sets outcome_weight 0 and replaces the criteria with one that predicts the
    outcome perfectly on the val episodes (AUC 1.0 vs 0.5): gated on partial credit alone it
    was accepted, and the policy would have been trained on a reward without the outcome."""
    from coevo.assets.rubric import Rubric

    zero = {"kind": "rubric", "rationale": "drop the outcome", "changes": {
        "outcome_weight": 0.0, "criteria": [
            {"id": "leading-a", "kind": "regex", "weight": 1.0, "params": {"pattern": "^a"}}]}}
    cfg = config(tmp_path, "harness-only", candidates=(zero,), rounds=1,
                 assets={"harness": "tiny", "rubric": "flat"})
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'loop.db'}")
    flat = Rubric.model_validate({"name": "flat", "outcome_weight": 1.0, "criteria": [
        {"id": "wordy", "kind": "regex", "params": {"pattern": "\\w"}}]})
    store.put_asset(flat)
    parts.backend = parts.rl_backend = ParityPolicy(parts.tokenizer)
    res = run_coevolution(cfg, store, parts)
    [p] = store.proposals(res.run)
    assert p.status == "invalid" and store.decisions(p.id) == []
    assert p.error.startswith("lowers the verified outcome's share of the reward from 0.500 to 0.000")
    assert res.incumbent["rubric"] == flat.hash


def test_one_round_with_an_llm_judge_rubric(tmp_path):
    """A rubric with an llm_judge criterion (the rubrics proposer offers them by default)
    crashed the RL stage, the gate and the final test ("no judge backend was given"). The
    run's judge answers them everywhere; without one, the policy's backend is the judge."""
    from coevo.assets.rubric import Rubric

    judged = Rubric.model_validate({"name": "judged", "outcome_weight": 1.0, "criteria": [
        {"id": "polite", "kind": "llm_judge", "params": {"question": "Is the reply polite?"}}]})
    cfg = config(tmp_path, "gated", assets={"harness": "tiny", "rubric": "judged"})
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'judge.db'}")
    store.put_asset(judged)
    parts.judge = ScriptedBackend(lambda request, i: "4", name="judge")  # 4 of 5
    res = run_coevolution(cfg, store, parts)
    trajs = store.trajectories(res.run)
    assert {t.split for t in trajs} == {"train", "val", "test"}  # RL, gate + val curve, final
    assert all(t.criteria == {"polite": 0.8} for t in trajs)
    assert all(t.reward == t.outcome + 0.8 for t in trajs)
    assert len(parts.judge.requests) == len(trajs)  # one question per episode
    assert store.get_proposal(store.proposals(res.run)[0].id).status == "accepted"
    # the default judge: the policy itself (its replies carry no score: the criterion is missing)
    cfg2 = config(tmp_path, "harness-only", name="default-judge",
                  assets={"harness": "tiny", "rubric": "judged"})
    store2, parts2 = build(tmp_path, cfg2, f"sqlite:///{tmp_path / 'judge2.db'}")
    store2.put_asset(judged)
    res2 = run_coevolution(cfg2, store2, parts2)
    assert res2.final is not None and res2.final.mean == 1.0
    asked = [r for r in parts2.backend.requests if r.prompt_ids is None]
    assert asked and "Is the reply polite?" in asked[0].messages[-1]["content"]
    assert all(t.criteria == {} for t in store2.trajectories(res2.run))


def test_spend_is_charged_in_tokens_and_demos_costs_no_call(tmp_path):
    """Every rollout's prefilled + generated tokens are charged (RL rollouts, gate arms), the
    RL update's tokens apart; the demos proposer calls no model and is charged nothing."""
    cfg = config(tmp_path, "gated", proposers=[{"name": "demos"}])
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'spend.db'}")
    res = run_coevolution(cfg, store, parts)
    spent = store.budget_totals(res.run, round=0)
    assert "proposer_calls" not in spent
    [r0] = store.rounds(res.run)
    tracked = {x.id for e in r0.summary["evaluations"].values()
               for x in store.trajectories(evaluation=e)}
    charged = [t for t in store.trajectories(res.run, round=0) if t.id not in tracked]
    assert spent["tokens"] == sum(len(t.token_ids) for t in charged) > 0
    rl = [t for t in charged if t.split == "train"]
    assert spent["train_tokens"] == sum(len(t.token_ids) for t in rl if t.trainable) > 0
    assert spent["rollouts"] == len(charged)


def test_the_gate_plans_only_what_the_round_budget_can_pay_for(tmp_path):
    """A round budget of 24 rollouts: the 8 train rollouts leave 16, so the first comparison
    plans 8 of the 12 val tasks (both arms, worst case) instead of overshooting by a whole
    comparison; the second candidate finds the budget used up and is not gated."""
    cfg = config(tmp_path, "harness-only", gate={"screen_size": 4, "chunk_size": 4, "n_boot": 200},
                 budgets={"rollouts": 24})
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'cap.db'}")
    res = run_coevolution(cfg, store, parts)
    props = _by_rationale(store, res.run)
    [d] = store.decisions(props[HELPS["rationale"]].id)
    assert d.accepted and len(d.evidence) == 8 and d.stages[-1]["tasks_total"] <= 8
    [other] = store.decisions(props[NO_EFFECT["rationale"]].id)
    assert other.policy == "budget" and "rollouts 24 >= 24" in other.reason
    assert store.budget_totals(res.run, round=0)["rollouts"] == 24


def test_an_unchanged_incumbent_s_val_score_is_reused_not_rerun(tmp_path):
    """Harness-only rounds that accept nothing leave the incumbent as it was (assets, no
    checkpoint): its val evaluation is the same measurement, so later rounds reuse it."""
    cfg, store, parts, res = _run(tmp_path, "harness-only", candidates=(NO_EFFECT,), rounds=3)
    rounds = store.rounds(res.run)
    assert len(rounds) == 3 and not any(x.summary["accepted"] for x in rounds)
    start = rounds[0].summary["evaluations"]["val_start"]
    assert [x.summary["evaluations"]["val"] for x in rounds] == [start] * 3
    assert [x.summary["val_score"] for x in rounds] == [rounds[0].summary["val_start_score"]] * 3
    # one val evaluation's episodes (12 tasks x 1 sample) were run and charged, not four
    assert sum(x.summary["spent"].get("eval_rollouts", 0) for x in rounds) == 12
    # an incumbent that changes is measured afresh (the gated test: 0.0 -> 1.0)
    _, store2, _, res2 = _run(tmp_path / "g", "gated")
    [r0] = store2.rounds(res2.run)
    assert r0.summary["evaluations"]["val"] != r0.summary["evaluations"]["val_start"]
