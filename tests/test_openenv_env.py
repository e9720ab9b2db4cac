"""`openenv:` environments: OpenEnv (openenv-core 0.3) environments defined here with its own
base classes (a typed-action guessing game with a WeightedSum rubric, an MCPEnvironment with
FastMCP tools), run in-process through `coevo eval` and directly; the missing-package error."""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Optional

import pytest
from fastmcp import FastMCP
from openenv.core import (Action, CallToolAction, CallToolObservation, Environment,
                          MCPEnvironment, Observation, State)
from openenv.core.rubrics import Rubric, WeightedSum

from coevo.envs.base import Response
from coevo.envs.registry import make_env
from coevo.errors import CoevoError
from coevo.trajectory import ToolCall
from eval_glue import ALL_VAL, scripted_eval


class GuessAction(Action):
    """Guess the hidden number."""

    guess: int


class GuessObservation(Observation):
    clue: str = ""
    hint: str = ""
    distance: int = 0


class Exact(Rubric):
    def forward(self, action: GuessAction, observation: GuessObservation) -> float:
        return float(observation.distance == 0)


class Close(Rubric):
    def forward(self, action: GuessAction, observation: GuessObservation) -> float:
        return max(0.0, 1.0 - observation.distance / 10)


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    """Hidden number = (3 * seed + offset) % 10; the clue states it as a sum."""

    def __init__(self, offset: int = 0):
        super().__init__(rubric=WeightedSum([Exact(), Close()], weights=[0.8, 0.2]))
        self.offset, self.target, self._state = offset, 0, State()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None,
              **kwargs: Any) -> GuessObservation:
        self._reset_rubric()
        self.target = (3 * (seed or 0) + self.offset) % 10
        self._state = State(episode_id=episode_id, step_count=0)
        half = self.target // 2
        return GuessObservation(clue=f"The number is {half} + {self.target - half}.",
                                hint="Guess a number from 0 to 9.")

    def step(self, action: GuessAction, timeout_s: Optional[float] = None,
             **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        d = abs(action.guess - self.target)
        obs = GuessObservation(hint="correct" if d == 0 else ("higher" if action.guess < self.target
                                                              else "lower"),
                               distance=d, done=d == 0)
        obs.reward = self._apply_rubric(action, obs)
        return obs

    @property
    def state(self) -> State:
        return self._state


class LedgerEnv(MCPEnvironment):
    """Tools over FastMCP: `add` computes, `submit` ends the episode with a reward."""

    def __init__(self):
        mcp = FastMCP("ledger")

        @mcp.tool()
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @mcp.tool()
        def submit(total: int) -> str:
            """Submit the final total."""
            return "received"

        super().__init__(mcp)
        self.expected, self._state = 0, State()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None,
              **kwargs: Any) -> Observation:
        self.expected = 10 + (seed or 0)
        return CallToolObservation(tool_name="", result=f"Add 10 and {seed or 0}, then submit.")

    def step(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        obs = super().step(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction) and action.tool_name == "submit":
            obs.reward = float(action.arguments.get("total") == self.expected)
            obs.done = True
        return obs

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any):
        raise ValueError("only tool calls")

    @property
    def state(self) -> State:
        return self._state



def test_resets_become_tasks_and_the_action_schema_the_step_tool():
    env = make_env("openenv:test_openenv_env:GuessEnv?seeds=4&offset=1")
    tasks = env.all_tasks()
    assert [t.id for t in tasks] == [f'reset{{"seed":{i}}}' for i in range(4)]
    assert json.loads(tasks[0].messages[0]["content"]) == {
        "clue": "The number is 0 + 1.", "hint": "Guess a number from 0 to 9.", "distance": 0}
    (tool,) = tasks[0].tools
    assert tool["function"]["name"] == "step"
    assert tool["function"]["description"] == "Guess the hidden number."
    assert set(tool["function"]["parameters"]["properties"]) == {"guess"}
    assert env.name == "openenv:test_openenv_env:GuessEnv?offset=1&seeds=4"
    resets = make_env('openenv:test_openenv_env:GuessEnv?resets=[{"seed":7},{"seed":2}]')
    assert [t.id for t in resets.all_tasks()] == ['reset{"seed":7}', 'reset{"seed":2}']


def test_a_right_guess_scores_1_and_a_wrong_one_0_with_the_rubric_parts():
    env = make_env("openenv:test_openenv_env:GuessEnv?seeds=3")
    task = env.all_tasks()[1]  # seed 1: the number is 3
    right = env.start(task)
    (obs,) = env.step(right, [ToolCall(name="step", arguments={"guess": 3})])
    assert json.loads(obs.content)["hint"] == "correct"
    after = env.step(right, [ToolCall(name="step", arguments={"guess": 3})])
    assert "episode is over" in after[0].error
    s = env.score(task, right, Response(text="done"))
    assert (s.outcome, s.success) == (1.0, True)
    assert s.details == {"steps": 1.0, "done": 1.0, "rubric": 1.0, "rubric.rubric_0": 1.0,
                         "rubric.rubric_1": 1.0}
    wrong = env.start(task)
    (obs,) = env.step(wrong, [ToolCall(name="step", arguments={"guess": 13})])
    assert json.loads(obs.content)["hint"] == "lower"
    bad = env.step(wrong, [ToolCall(name="step", arguments={"guess": "eight"}),
                           ToolCall(name="guess", arguments={"guess": 1})])
    assert "bad action" in bad[0].error and "guess" in bad[0].error
    assert "unknown tool 'guess'" in bad[1].error
    s = env.score(task, wrong, Response(text="13"))
    assert (s.outcome, s.success) == (0.0, False) and s.info["rewards"] == [0.0]
    assert s.details == {"steps": 1.0, "done": 0.0, "rubric": 0.0, "rubric.rubric_0": 0.0,
                         "rubric.rubric_1": 0.0}


def test_an_mcp_tool_call_runs_the_tool_and_returns_its_output():
    env = make_env("openenv:test_openenv_env:LedgerEnv?seeds=2")
    task = env.all_tasks()[1]
    assert {t["function"]["name"] for t in task.tools} == {"add", "submit"}
    assert "Add 10 and 1" in task.messages[0]["content"]
    ep = env.start(task)
    (added,) = env.step(ep, [ToolCall(name="add", arguments={"a": 10, "b": 1})])
    assert (added.content, added.error) == ("11", None)
    (missing,) = env.step(ep, [ToolCall(name="add", arguments={"a": 10})])
    assert missing.error and "b" in missing.error
    env.step(ep, [ToolCall(name="submit", arguments={"total": 11})])
    assert env.score(task, ep, Response(text="")).outcome == 1.0


def test_coevo_eval_through_the_adapter_stores_the_environment_rewards(tmp_path, monkeypatch):
    def script(request, index):
        last = request.messages[-1]
        if last["role"] == "tool":
            return "done"
        a, b = (int(x) for x in re.findall(r"\d+", json.loads(last["content"])["clue"]))
        guess = a + b if (a + b) % 2 == 0 else (a + b + 5) % 10  # odd numbers: 5 off
        return f'<tool_call>{{"name": "step", "arguments": {{"guess": {guess}}}}}</tool_call>'

    output, stored = scripted_eval(tmp_path, monkeypatch, script,
                                   f"openenv:test_openenv_env:GuessEnv?seeds=4&split={ALL_VAL}")
    got = {t.task_id: (t.outcome, t.success, len(t.turns)) for t in stored}
    # seeds 0..3 hide 0, 3, 6, 9: even ones are guessed; odd ones are 5 off (reward 0.8*0+0.2*0.5)
    assert got == {'reset{"seed":0}': (1.0, True, 2), 'reset{"seed":1}': (pytest.approx(0.1), False, 2),
                   'reset{"seed":2}': (1.0, True, 2), 'reset{"seed":3}': (pytest.approx(0.1), False, 2)}
    assert "0.550" in output  # the mean outcome in the printed table


def test_bad_specs_are_one_line_errors():
    with pytest.raises(CoevoError, match="not an OpenEnv Environment"):
        make_env("openenv:test_openenv_env:not_an_env")
    with pytest.raises(CoevoError, match="unexpected keyword argument 'colour'"):
        make_env("openenv:test_openenv_env:GuessEnv?colour=red")
    with pytest.raises(CoevoError, match="reward must be sum or last"):
        make_env("openenv:test_openenv_env:GuessEnv?reward=max")
    with pytest.raises(CoevoError, match="must look like pkg.module:factory"):
        make_env("openenv:GuessEnv")


def test_missing_package_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "openenv", None)
    with pytest.raises(CoevoError) as e:
        make_env("openenv:test_openenv_env:GuessEnv")
    assert "\n" not in str(e.value) and "pip install 'coevo[openenv]'" in str(e.value)


def not_an_env() -> dict:
    return {}
