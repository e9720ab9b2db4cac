"""The teacher term (coevo/rl/teacher.py) on a tiny random Llama built in code: the KL term's
value and gradient on a 2-token example computed with torch directly, the gap schedule at
given reward pairs, the teacher's context (its prompt holds the extra demos, the scored
student tokens are identical), config errors, checkpointed schedule state, and one RL-stage
step that measures the teacher."""

from __future__ import annotations

import pytest
import torch

from coevo.errors import AssetError, CoevoError
from coevo.executors import AgentAssets
from coevo.agent.context import TokenSequence
from coevo.agent.episode import build_messages
from coevo.rl import TrainConfig, Trainer, load_checkpoint, save_checkpoint
from coevo.rl.batch import to_sample
from coevo.rl.stage import StageConfig, rl_stage
from coevo.rl.teacher import (
    DistillTeacher,
    TeacherConfig,
    gap_weight,
    teacher_sample,
)
from coevo.store import Store
from coevo.trajectory import Trajectory
from tiny_glue import FirstCharEnv, load_tiny_model, save_tiny_model, tiny_harness

torch.set_num_threads(1)  # tiny models run slower with more threads on a shared 2-core box

DEMO = {"messages": [{"role": "user", "content": "Say something about 7."},
                     {"role": "assistant", "content": "The answer is 42."}]}
LORA = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
HARNESS = tiny_harness()
ASSETS = AgentAssets(harness=HARNESS)


def distill(**kw) -> dict:
    return {"kind": "distill", "demos": [DEMO], "weight": 0.5, **kw}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-teacher"))


def bound_trainer(tiny_dir, teacher: dict, **train) -> tuple[Trainer, object]:
    model, tok = load_tiny_model(tiny_dir)
    cfg = TrainConfig(seed=0, lora=LORA, teacher=teacher, **train)
    trainer = Trainer(model, cfg, base_model="tiny", tokenizer=tok)
    trainer.teacher.bind(env=FirstCharEnv(), assets=ASSETS, tokenizer=tok)
    gen = torch.Generator().manual_seed(3)  # B = 0 at init: the policy would equal the base
    with torch.no_grad():
        for n, p in trainer.named_trainable_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return trainer, tok


def logprobs_of(model, ids: list[int], at: list[int]) -> torch.Tensor:
    """log pi(ids[i] | ids[:i]) for i in `at`, one plain forward (with grad)."""
    logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return torch.stack([logp[i - 1, ids[i]] for i in at])


def two_token_trajectory(trainer: Trainer, tok, task_id: str = "train-3") -> Trajectory:
    """The student's first prompt for the task plus two tokens, with the policy's own
    log-probs stored as the sampler's (so the PPO ratio is exactly 1)."""
    task = {t.id: t for t in FirstCharEnv().tasks("train")}[task_id]
    prompt = TokenSequence(tok, build_messages(HARNESS, task, [])).ids
    toks = tok.encode("fox jumps", add_special_tokens=False)[:2]
    assert len(toks) == 2
    ids = prompt + toks
    with torch.no_grad():
        lp = logprobs_of(trainer.model, ids, [len(prompt), len(prompt) + 1]).tolist()
    p = len(prompt)
    return Trajectory(env="test:first-char", task_id=task_id, group_id="g", token_ids=ids,
                      loss_mask=[0] * p + [1, 1], logprobs=[0.0] * p + lp, prompt_len=p,
                      reward=0.0)


# --- the schedule ---------------------------------------------------------------------------------


@pytest.mark.parametrize("r_teacher, r_student, expected", [
    (0.8, 0.2, 0.5 * 0.75),   # gap 0.6 of the teacher's 0.8
    (1.0, 0.0, 0.5),          # the whole gap: w0
    (0.4, 0.4, 0.0),          # caught up
    (0.5, 0.9, 0.0),          # overtaken: clipped at 0, never negative
    (0.0, 0.0, 0.0),          # a teacher that never succeeds teaches nothing (eps, no 0/0)
    (None, 0.3, 0.5),         # teacher not measured yet: w0
])
def test_gap_weight_at_reward_pairs(r_teacher, r_student, expected):
    assert gap_weight(0.5, r_teacher, r_student) == pytest.approx(expected, abs=1e-12)


def test_schedule_uses_running_means_over_the_window():
    t = DistillTeacher(TeacherConfig(**distill(schedule={"window": 2})))
    assert t.weight() == 0.5  # nothing measured
    for r in (0.0, 0.2, 0.4):  # window 2: R_S = (0.2 + 0.4) / 2 = 0.3
        t.observe_student(r)
    for r in (0.2, 0.9, 0.7):  # R_T = (0.9 + 0.7) / 2 = 0.8
        t.observe_teacher(r)
    assert t.means() == (pytest.approx(0.8), pytest.approx(0.3))
    assert t.weight() == pytest.approx(0.5 * 0.5 / 0.8)
    assert [t.due(s) for s in range(6)] == [True, False, False, False, False, True]
    const = DistillTeacher(TeacherConfig(**distill(schedule={"kind": "constant"})))
    const.observe_teacher(0.0)
    const.observe_student(1.0)
    assert const.weight() == 0.5 and not const.due(0)


# --- the teacher's context --------------------------------------------------------------------------


def test_teacher_prompt_holds_the_demos_and_scores_the_same_tokens(tiny_dir):
    trainer, tok = bound_trainer(tiny_dir, distill())
    traj = two_token_trajectory(trainer, tok)
    teacher_ids = trainer.teacher.prompt_ids(traj)
    student_text = tok.decode(traj.token_ids[: traj.prompt_len])
    teacher_text = tok.decode(teacher_ids)
    assert "The answer is 42." in teacher_text and "The answer is 42." not in student_text
    assert "Say something about 3." in teacher_text  # the same task
    assert len(teacher_ids) > traj.prompt_len

    sample = to_sample(traj, 0.0)
    t_sample, offset = teacher_sample(sample, teacher_ids)
    assert offset == len(teacher_ids) - traj.prompt_len
    assert t_sample.ids[: len(teacher_ids)].tolist() == teacher_ids
    assert t_sample.ids[len(teacher_ids):].tolist() == traj.token_ids[traj.prompt_len:]
    scored = lambda s: s.ids[s.mask > 0].tolist()  # noqa: E731
    assert scored(t_sample) == scored(sample) == traj.token_ids[-2:]


def test_teacher_harness_from_the_store_and_too_many_demos(tiny_dir, tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    rich = tiny_harness(name="rich", system_prompt="Think, then reply briefly in one word.")
    store.put_asset(rich)
    _, tok = load_tiny_model(tiny_dir)
    t = DistillTeacher(TeacherConfig(kind="distill", harness="rich"))
    t.bind(env=FirstCharEnv(), assets=ASSETS, tokenizer=tok, store=store)
    assert t.assets().harness.system_prompt == rich.system_prompt
    assert "Think, then reply" in tok.decode(t.prompt_ids(Trajectory(env="e", task_id="train-1")))
    many = DistillTeacher(TeacherConfig(kind="distill", demos=[DEMO] * 17))
    with pytest.raises(CoevoError, match="rl.train.teacher.demos: .*17 demos"):
        many.bind(env=FirstCharEnv(), assets=ASSETS, tokenizer=tok)
    missing = DistillTeacher(TeacherConfig(kind="distill", harness="nope"))
    with pytest.raises(CoevoError, match="rl.train.teacher.harness"):
        missing.bind(env=FirstCharEnv(), assets=ASSETS, tokenizer=tok, store=store)


# --- the term's value and gradient --------------------------------------------------------------------


def test_kl_term_value_and_gradient_on_two_tokens(tiny_dir):
    w0 = 0.5
    trainer, tok = bound_trainer(tiny_dir, distill(schedule={"kind": "constant"}),
                                 max_grad_norm=None)
    traj = two_token_trajectory(trainer, tok)
    p, model = traj.prompt_len, trainer.model
    teacher_ids = trainer.teacher.prompt_ids(traj) + traj.token_ids[p:]
    m = len(teacher_ids) - 2

    # By hand: d_t = log pi_student(y_t) - log pi_teacher(y_t); L = w0 * (d_1 + d_2) / 2;
    # grad L = w0 * (d_1 grad log pi(y_1) + d_2 grad log pi(y_2)) / 2 (d held fixed).
    model.eval()
    lp_student = logprobs_of(model, traj.token_ids, [p, p + 1])
    with torch.no_grad(), model.disable_adapter():
        lp_teacher = logprobs_of(model, teacher_ids, [m, m + 1])
    d = (lp_student - lp_teacher).detach()
    assert d.abs().min() > 1e-3  # the two contexts really score the tokens differently
    expected_loss = w0 * float(d.sum()) / 2
    surrogate = w0 * (d * lp_student).sum() / 2
    params = trainer.trainable_parameters()
    expected_grad = torch.autograd.grad(surrogate, params)

    # The trainer: one trajectory, a group without reward signal, so the teacher term is all.
    trainer.optimizer = torch.optim.SGD(params, lr=1.0)  # delta = -grad exactly
    before = [q.detach().clone() for q in params]
    stats = trainer.step([traj])
    assert stats.signal_groups == 0 and stats.updated and stats.teacher_weight == w0
    assert stats.teacher_kl == pytest.approx(float(d.mean()), abs=1e-5)
    assert stats.loss == pytest.approx(expected_loss, abs=1e-5)
    for b, q, g in zip(before, params, expected_grad):
        torch.testing.assert_close(b - q.detach(), g, atol=1e-6, rtol=1e-4)
    assert any(g.abs().max() > 1e-6 for g in expected_grad)


def test_zero_weight_trains_exactly_like_no_teacher(tiny_dir):
    """Gap schedule with a teacher that scored 0: w = 0, so the step is the plain GRPO step."""
    def run(teacher: dict) -> list[torch.Tensor]:
        trainer, tok = bound_trainer(tiny_dir, teacher)
        trajs = [two_token_trajectory(trainer, tok, f"train-{i}") for i in range(2)]
        trajs = [t.model_copy(update={"group_id": "g", "sample_index": i, "reward": float(i)})
                 for i, t in enumerate(trajs)]
        trajs.append(two_token_trajectory(trainer, tok, "train-5").model_copy(
            update={"group_id": "quiet", "reward": 1.0}))  # a group without signal
        trainer.teacher.observe_teacher(0.0)
        stats = trainer.step(trajs)
        assert stats.teacher_weight == 0.0 and stats.signal_groups == 1
        return [q.detach().clone() for q in trainer.trainable_parameters()]

    for a, b in zip(run({"kind": "none"}), run(distill())):
        assert torch.equal(a, b)


# --- config and checkpoints ----------------------------------------------------------------------------


def test_config_errors_name_the_field():
    with pytest.raises(AssetError, match=r"teacher.kind.*unknown teacher 'kd'; known: distill, none"):
        TrainConfig.from_mapping({"teacher": {"kind": "kd"}}, "run.yaml")
    with pytest.raises(AssetError, match="teacher.*richer context"):
        TrainConfig.from_mapping({"teacher": {"kind": "distill"}}, "run.yaml")
    with pytest.raises(AssetError, match="teacher needs lora.enabled"):
        TrainConfig.from_mapping({"teacher": distill(), "lora": {"enabled": False}}, "run.yaml")
    with pytest.raises(AssetError, match="teacher.schedule.every"):
        TrainConfig.from_mapping({"teacher": distill(schedule={"every": 0})}, "run.yaml")
    assert TrainConfig.from_mapping({"teacher": distill()}).teacher.demos[0].messages[1].content \
        == "The answer is 42."


def test_schedule_state_survives_a_checkpoint(tiny_dir, tmp_path):
    trainer, _ = bound_trainer(tiny_dir, distill())
    trainer.teacher.observe_student(0.25)
    trainer.teacher.observe_teacher(0.75)
    save_checkpoint(trainer, tmp_path / "ck")
    fresh, _ = bound_trainer(tiny_dir, distill())
    assert fresh.teacher.weight() == 0.5
    load_checkpoint(fresh, tmp_path / "ck")
    assert fresh.teacher.state_dict() == {"student_rewards": [0.25], "teacher_rewards": [0.75]}
    assert fresh.teacher.weight() == pytest.approx(0.5 * (0.75 - 0.25) / 0.75)


def test_stage_measures_the_teacher_on_the_steps_tasks(tiny_dir, tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    store.create_run("r")
    store.start_round("r", 0)
    model, tok = load_tiny_model(tiny_dir)
    trainer = Trainer(model, TrainConfig(seed=0, lora=LORA, teacher=distill(
        schedule={"every": 2})), base_model="tiny", tokenizer=tok)
    logs = []
    cfg = StageConfig(steps=2, tasks_per_step=2, samples=2, checkpoint_every=2, seed=1)
    rl_stage(store, "r", 0, FirstCharEnv(), ASSETS, trainer, cfg, tokenizer=tok,
             on_step=logs.append)
    assert logs[0].teacher_reward is not None and logs[1].teacher_reward is None  # every 2
    assert trainer.teacher.teacher_rewards == [logs[0].teacher_reward]
    assert trainer.teacher.student_rewards == [x.reward_mean for x in logs]
    assert logs[0].teacher_weight == pytest.approx(
        gap_weight(0.5, logs[0].teacher_reward, logs[0].reward_mean))
    # the teacher's 4 rollouts are charged with the step, never stored as trajectories
    assert len(store.trajectories(run="r")) == 2 * 2 * 2
    assert store.budget_totals("r")["rollouts"] == 2 * 2 * 2 + 2 * 2
