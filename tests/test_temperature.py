"""Temperature schedules of the RL stage (coevo/rl/temperature.py): hand-computed posteriors."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from coevo.envs.base import Task
from coevo.errors import CoevoError
from coevo.rl.stage import StageConfig
from coevo.rl.temperature import build_temperature
from coevo.trajectory import Trajectory

TASKS = [Task(id=i, env="e", messages=[]) for i in ("a", "b", "c")]


class FakeStore:
    """`trajectories(run=, split=)` over a fixed list (what the schedule reads)."""

    def __init__(self, trajs):
        self.trajs = trajs

    def trajectories(self, run=None, split=None, **_):
        return [t for t in self.trajs if t.split == split]


def roll(task, step, success, **kw):
    return Trajectory(env="e", task_id=task, policy_step=step, success=success,
                      outcome=float(success), reward=float(success), **kw)


HISTORY = FakeStore(
    # a: 3 wins 1 loss over steps 0-1; b: 0 wins 4 losses; c: nothing verified.
    [roll("a", 0, True), roll("a", 0, False), roll("a", 1, True), roll("a", 1, True),
     roll("b", 0, False), roll("b", 0, False), roll("b", 1, False), roll("b", 1, False),
     roll("c", 1, True, status="infra_error"),  # missing data, not a win
     roll("c", 1, False, split="val"),  # not the stage's own (train) history
     roll("a", 2, False), roll("b", 2, True)])  # step 2 itself: not read for step 2


def test_fixed_keeps_the_harness_temperature():
    assert build_temperature("fixed", 0.7).temperatures(5, TASKS) is None


def test_fixed_with_a_value_samples_a_greedy_harness_at_the_stages_own_temperature():
    """A harness at temperature 0 (greedy) would give a group G copies; `value` is the RL
    stage's own temperature for every task, whatever the harness's."""
    sched = build_temperature("fixed", 0.0, options={"value": 0.7})
    assert sched.temperatures(5, TASKS) == {t.id: 0.7 for t in TASKS} and sched.base == 0.7
    with pytest.raises(CoevoError, match=r"rl.stage.temperature_options: .*value"):
        build_temperature("fixed", 0.0, options={"value": 0.0})


def test_tempered_maps_beta_posteriors_to_temperatures():
    sched = build_temperature("tempered", 0.7, store=HISTORY, run="r")
    # prior Beta(1, 1): a -> (1 + 3, 1 + 1) = (4, 2), b -> (1, 5), c -> (1, 1)
    assert sched.posteriors(2, TASKS) == {"a": (4, 2), "b": (1, 5), "c": (1, 1)}
    # T = 0.7 + 0.3 (2q - 1), q = b / (a + b): a q = 1/3 -> 0.6; b q = 5/6 -> 0.9; c -> 0.7
    assert sched.temperatures(2, TASKS) == pytest.approx({"a": 0.6, "b": 0.9, "c": 0.7})
    # step 0: no history, every task at the harness's temperature (as "fixed")
    assert sched.temperatures(0, TASKS) == pytest.approx({"a": 0.7, "b": 0.7, "c": 0.7})


def test_tempered_bounds_prior_and_window():
    o = {"spread": 1.0, "max_temperature": 1.2, "min_temperature": 0.5, "prior": 2.0,
         "history_steps": 1, "base": 1.0}
    sched = build_temperature("tempered", 0.7, store=HISTORY, run="r", options=o)
    # step 2 reads step 1 only: a (2 + 2, 2 + 0) q = 1/3; b (2, 2 + 2) q = 2/3; c (2, 2)
    assert sched.posteriors(2, TASKS) == {"a": (4, 2), "b": (2, 4), "c": (2, 2)}
    # base 1.0 (not the harness's 0.7), spread 1: a 1 - 1/3 = 2/3; b 1 + 1/3 -> clamp 1.2
    assert sched.temperatures(2, TASKS) == pytest.approx({"a": 2 / 3, "b": 1.2, "c": 1.0})
    low = build_temperature("tempered", 0.7, store=HISTORY, run="r",
                            options={"spread": 1.0, "min_temperature": 0.5})
    assert low.temperatures(2, TASKS)["a"] == pytest.approx(0.5)  # 0.7 - 1/3 -> clamp 0.5


def test_config_errors_name_the_field():
    with pytest.raises(ValidationError, match=r"temperature\n.*unknown temperature schedule 'hot'; "
                                              r"known: fixed, tempered"):
        StageConfig(temperature="hot")
    with pytest.raises(ValidationError, match=r"temperature_options\n.*spred: Extra inputs"):
        StageConfig(temperature="tempered", temperature_options={"spred": 1})
    with pytest.raises(CoevoError, match=r"^rl.stage.temperature_options: min_temperature 2.0 "
                                         r"is above max_temperature 1.0"):
        build_temperature("tempered", 0.7, options={"min_temperature": 2, "max_temperature": 1})
