"""`verifiers:` environments: PrimeIntellect verifiers (0.4, `verifiers.v1`) tasksets built here
in code from in-memory rows with verifiers' own classes (a single-turn taskset with weighted
rewards and a metric, a taskset whose tasks have a Toolset), scored through `coevo eval` and
directly; the missing-package error."""

from __future__ import annotations

import re
import sys

import pytest

if sys.version_info < (3, 11):  # verifiers requires it (requirements-nodeps.txt skips it there)
    pytest.skip("verifiers needs Python >= 3.11", allow_module_level=True)

import verifiers.v1 as vf  # noqa: E402

from coevo.envs.base import Response
from coevo.envs.registry import make_env
from coevo.errors import CoevoError, InfraError
from coevo.trajectory import ToolCall
from eval_glue import ALL_VAL, scripted_eval

ROWS = [("What is 6 times 7?", "42"), ("What is 3 times 5?", "15"),
        ("What is 9 times 9?", "81"), ("What is 2 times 8?", "16")]


class Row(vf.TaskData):
    answer: str


class QATask(vf.Task[Row]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.metric
    async def words(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply.split()))


class QAConfig(vf.TasksetConfig):
    n: int = len(ROWS)
    system: str | None = None


class QATaskset(vf.Taskset[QATask, QAConfig]):
    def load(self):
        for question, answer in ROWS[: self.config.n]:
            yield QATask(Row(prompt=question, answer=answer, system_prompt=self.config.system),
                         self.config.task)


def arithmetic(**options) -> vf.Taskset:
    """The factory a spec names: verifiers:test_verifiers_env:arithmetic?n=3"""
    return QATaskset(QAConfig(**options))


class CalcState(vf.State):
    calls: int = 0


class Calculator(vf.Toolset[vf.ToolsetConfig, CalcState]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers."""
        self.state.calls += 1
        return a * b


class ToolTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class ToolTask(vf.Task[Row, CalcState, ToolTaskConfig]):
    @classmethod
    def toolsets(cls, config: ToolTaskConfig) -> list[vf.Toolset]:
        return [Calculator(config.tools)]

    @vf.reward(weight=0.5)
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.reward(weight=0.5)
    async def used_tool(self, trace: vf.Trace) -> float:
        seen = [m.content for m in trace.tool_messages]
        return float(trace.state.calls > 0 and self.data.answer in seen)


class ToolConfig(vf.TasksetConfig):
    task: ToolTaskConfig = ToolTaskConfig()


class ToolTaskset(vf.Taskset[ToolTask, ToolConfig]):
    def load(self):
        for question, answer in ROWS:
            yield ToolTask(Row(prompt=question, answer=answer), self.config.task)


def calculator() -> vf.Taskset:
    return ToolTaskset(ToolConfig())



def numbers(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def test_rows_become_tasks_with_stable_ids_and_the_system_prompt_first():
    env = make_env("verifiers:test_verifiers_env:arithmetic?n=3&system=Answer with digits.")
    assert env.single_turn and env.name.endswith("?n=3&system=Answer with digits.")
    tasks = env.all_tasks()
    assert len(tasks) == 3 and len({t.id for t in tasks}) == 3
    assert tasks[0].messages == [{"role": "user", "content": "Answer with digits.\n\nWhat is 6 times 7?"}]
    assert tasks[0].answer["answer"] == "42" and tasks[0].tools == []
    # ids hash the row without its position: a shorter taskset keeps the same ids
    shorter = make_env("verifiers:test_verifiers_env:arithmetic?n=2&system=Answer with digits.")
    assert [t.id for t in shorter.all_tasks()] == [t.id for t in tasks[:2]]
    sizes = [len(env.tasks(s)) for s in ("train", "val", "test")]
    assert sum(sizes) == 3


def test_a_right_answer_scores_1_and_a_wrong_one_0():
    env = make_env("verifiers:test_verifiers_env:arithmetic")
    task = env.all_tasks()[0]
    right = env.score(task, None, Response(text="42"))
    wrong = env.score(task, None, Response(text="the answer is 41"))
    assert (right.outcome, right.success) == (1.0, True)
    assert right.details == {"correct": 1.0, "metric:words": 1.0}
    assert (wrong.outcome, wrong.success) == (0.0, False)
    assert wrong.details == {"correct": 0.0, "metric:words": 4.0}


def test_a_tool_call_runs_the_tool_and_the_rewards_see_its_state():
    env = make_env("verifiers:test_verifiers_env:calculator")
    assert not env.single_turn
    task = env.all_tasks()[0]
    (spec,) = task.tools
    assert spec["function"]["name"] == "calc_multiply"
    assert spec["function"]["parameters"]["required"] == ["a", "b"]
    state = env.start(task)
    (result,) = env.step(state, [ToolCall(name="calc_multiply", arguments={"a": "6", "b": 7})])
    assert (result.content, result.error) == ("42", None)
    bad = env.step(state, [ToolCall(name="calc_multiply", arguments={"a": "six", "b": 7}),
                           ToolCall(name="calc_divide", arguments={})])
    assert "ValidationError" in bad[0].error and "unknown tool 'calc_divide'" in bad[1].error
    assert state.state.calls == 1
    score = env.score(task, state, Response(text="42"))
    assert score.outcome == 1.0 and score.details == {"correct": 1.0, "used_tool": 1.0}
    assert score.info["weights"] == {"correct": 0.5, "used_tool": 0.5}
    # the same answer without the tool: half the weighted reward; a fresh episode's state
    alone = env.score(task, env.start(task), Response(text="42"))
    assert alone.outcome == 0.5 and alone.details["used_tool"] == 0.0


def test_coevo_eval_through_the_adapter_stores_the_verifiers_scores(tmp_path, monkeypatch):
    def script(request, index):
        last = request.messages[-1]
        if last["role"] == "tool":
            return last["content"]  # the tool's product is the answer
        a, b = numbers(last["content"])
        if a == 9:  # answers without the tool, wrongly
            return "80"
        if a == 2:  # answers without the tool, rightly: half the reward
            return "16"
        return f'<tool_call>{{"name": "calc_multiply", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'

    output, stored = scripted_eval(tmp_path, monkeypatch, script,
                                   f"verifiers:test_verifiers_env:calculator?split={ALL_VAL}")
    env = make_env("verifiers:test_verifiers_env:calculator")
    by_question = {t.id: t.answer["prompt"] for t in env.all_tasks()}
    got = {by_question[t.task_id]: (t.outcome, t.success, len(t.turns)) for t in stored}
    assert got == {"What is 6 times 7?": (1.0, True, 2), "What is 3 times 5?": (1.0, True, 2),
                   "What is 9 times 9?": (0.0, False, 1), "What is 2 times 8?": (0.5, False, 1)}
    assert "0.625" in output  # the mean outcome in the printed table


def test_a_taskset_package_and_a_whole_env_are_accepted(tmp_path, monkeypatch):
    (tmp_path / "calc_taskset.py").write_text(
        "from test_verifiers_env import ToolTaskset\n__all__ = ['ToolTaskset']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    by_id = make_env("verifiers:calc_taskset")  # verifiers' own loader, by taskset id
    assert [t.tools for t in by_id.all_tasks()] == [t.tools for t in calculator_env().all_tasks()]
    assert by_id.name == "verifiers:calc_taskset"


def calculator_env():
    return make_env("verifiers:test_verifiers_env:whole_env")


def whole_env() -> vf.Env:
    """A factory returning a verifiers Env: the adapter plays its taskset."""
    return vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset={"id": "calc_taskset"}))


def test_unsupported_tasks_and_bad_factories_are_one_line_errors():
    with pytest.raises(CoevoError, match="returned int, not a verifiers Taskset"):
        make_env("verifiers:test_verifiers_env:not_a_taskset")
    with pytest.raises(CoevoError, match="cannot import 'no_such_module'"):
        make_env("verifiers:no_such_module:load")
    with pytest.raises(CoevoError, match="judged.*needs a verifiers runtime"):
        make_env("verifiers:test_verifiers_env:needs_runtime").all_tasks()


def test_a_failing_reward_is_missing_data_not_a_zero():
    env = make_env("verifiers:test_verifiers_env:broken")
    with pytest.raises(InfraError, match="ZeroDivisionError"):
        env.score(env.all_tasks()[0], None, Response(text="42"))


def test_missing_package_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(CoevoError) as e:
        make_env("verifiers:test_verifiers_env:arithmetic")
    assert "\n" not in str(e.value)
    assert "pip install 'coevo[verifiers]'" in str(e.value)


def not_a_taskset() -> int:
    return 3


class RuntimeTask(QATask):
    @vf.reward
    async def judged(self, trace: vf.Trace, runtime) -> float:
        return 1.0


class RuntimeTaskset(vf.Taskset[RuntimeTask, QAConfig]):
    def load(self):
        yield RuntimeTask(Row(prompt="q", answer="a"))


def needs_runtime() -> vf.Taskset:
    return RuntimeTaskset(QAConfig())


class BrokenTask(QATask):
    @vf.reward
    async def broken(self, trace: vf.Trace) -> float:
        return 1 / 0


class BrokenTaskset(vf.Taskset[BrokenTask, QAConfig]):
    def load(self):
        yield BrokenTask(Row(prompt="q", answer="a"))


def broken() -> vf.Taskset:
    return BrokenTaskset(QAConfig())
