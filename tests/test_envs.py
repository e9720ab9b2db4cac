"""Environments: BFCL single- and multi-turn verifiers, reasoning-gym, splits, registry."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from coevo.envs import Response, SplitSpec, make_env
from coevo.envs.base import Environment
from coevo.envs.bfcl import BFCLEnv, bfcl_modules, reference_calls, to_openai_tool
from coevo.envs.bfcl_multi import BFCLMultiEnv, _run_with_timeout
from coevo.envs.callparse import format_tool_calls, parse_tool_calls
from coevo.envs.reasoning_gym import ReasoningGymEnv, calculate
from coevo.envs.registry import ENV_KINDS, register_env
from coevo.envs.splits import assign, hash_unit, select, split_of
from coevo.errors import CoevoError, InfraError
from coevo.trajectory import ToolCall


@pytest.fixture(scope="module")
def simple():
    return BFCLEnv("simple_python")


@pytest.fixture(scope="module")
def multi():
    return BFCLMultiEnv("multi_turn_base", limit=3)


def by_id(env, task_id):
    return next(t for t in env.all_tasks() if t.id == task_id)


def score(env, task, calls=None, **kw):
    """The verifier on `calls`, written as the model would write them (BFCL's Python format:
    the outcome decodes the text) and as the harness parsed them."""
    kw.setdefault("text", format_tool_calls(calls, "python") if calls else "")
    return env.score(task, env.start(task), Response(tool_calls=calls or [], **kw))


# ------------------------------------------------------------------------- BFCL single-turn


def test_bfcl_task_shape(simple):
    task = by_id(simple, "simple_python_1")
    assert isinstance(simple, Environment) and simple.single_turn
    assert task.family == "simple_python" and task.env == "bfcl:simple_python"
    assert task.messages[0]["role"] == "user" and "factorial" in task.messages[0]["content"]
    fn = task.tools[0]["function"]
    assert fn["name"] == "math_factorial"  # BFCL's underscore convention for dotted names
    assert fn["parameters"]["type"] == "object" and fn["parameters"]["required"] == ["number"]
    assert task.answer == [{"math.factorial": {"number": [5]}}]
    assert len(simple.all_tasks()) == 400


def test_bfcl_possible_answer_scores_one(simple):
    for task in simple.all_tasks()[:25]:
        s = score(simple, task, reference_calls(task.answer, task.metadata["functions"]))
        assert s.outcome == 1.0 and s.success, (task.id, s.info)
        assert s.details == {"decodes": 1.0, "name_offered": 1.0, "required_args": 1.0,
                             "name_correct": 1.0, "args_correct": 1.0, "bfcl_decodes": 1.0,
                             "lenient_correct": 1.0}


def test_bfcl_wrong_value_scores_zero_with_partial_credit(simple):
    task = by_id(simple, "simple_python_0")  # calculate_triangle_area(base=10, height=5)
    s = score(simple, task, [ToolCall(name="calculate_triangle_area", arguments={"base": 10, "height": 7})])
    assert s.outcome == 0.0 and not s.success
    assert s.details["name_correct"] == 1.0 and s.details["required_args"] == 1.0
    assert s.details["args_correct"] == pytest.approx(2 / 3)  # base right, unit omittable, height wrong
    assert "height" in str(s.info["error"])


def test_bfcl_wrong_name_scores_zero(simple):
    task = by_id(simple, "simple_python_0")
    s = score(simple, task, [ToolCall(name="triangle_area", arguments={"base": 10, "height": 5})])
    assert s.outcome == 0.0
    assert s.details["name_correct"] == 0.0 and s.details["name_offered"] == 0.0
    assert s.details["decodes"] == 1.0 and s.details["args_correct"] == 0.0


def test_bfcl_missing_required_and_no_call(simple):
    task = by_id(simple, "simple_python_0")
    s = score(simple, task, [ToolCall(name="calculate_triangle_area", arguments={"base": 10})])
    assert s.outcome == 0.0 and s.details["required_args"] == 0.0
    s = score(simple, task, [], parse_error="invalid JSON")
    assert s.outcome == 0.0 and s.details["decodes"] == 0.0
    assert (s.info["error"], s.info["parse_error"]) == ("no function call decoded", "invalid JSON")


@pytest.mark.parametrize("fmt", ["python", "json", "chat_template"])
def test_bfcl_text_of_possible_answer_parses_and_scores(simple, fmt):
    task = by_id(simple, "simple_python_2")
    text = format_tool_calls(reference_calls(task.answer, task.metadata["functions"]), fmt)
    parsed = parse_tool_calls(text, fmt)
    assert parsed.error is None
    assert score(simple, task, parsed.calls).outcome == 1.0


def test_bfcl_prompting_style_text_with_dotted_name(simple):
    # What a model prompted with BFCL's own system prompt writes: the original dotted name.
    parsed = parse_tool_calls("[math.factorial(number=5)]", "python")
    assert score(simple, by_id(simple, "simple_python_1"), parsed.calls).outcome == 1.0
    assert score(simple, by_id(simple, "simple_python_1"),
                 parse_tool_calls("[math.factorial(number=6)]", "python").calls).outcome == 0.0


def test_bfcl_parallel_any_order_and_missing_call():
    env = BFCLEnv("parallel", limit=5)
    task = env.all_tasks()[0]
    calls = reference_calls(task.answer, task.metadata["functions"])
    assert len(calls) >= 2
    assert score(env, task, calls[::-1]).outcome == 1.0  # BFCL's parallel check ignores order
    s = score(env, task, calls[:1])
    assert s.outcome == 0.0 and s.details["name_correct"] == pytest.approx(1 / len(calls))


def test_bfcl_irrelevance_success_is_no_call():
    env = BFCLEnv("irrelevance", limit=3)
    task = env.all_tasks()[0]
    assert task.answer is None
    assert score(env, task, []).outcome == 1.0
    name = task.tools[0]["function"]["name"]
    assert score(env, task, [ToolCall(name=name, arguments={})]).outcome == 0.0


def test_openai_tool_conversion():
    doc = {"name": "a.b", "description": "d", "parameters": {
        "type": "dict", "required": ["x"], "properties": {
            "x": {"type": "float", "description": "num"},
            "t": {"type": "tuple", "items": {"type": "integer"}},
            "any": {"type": "any", "description": "anything"},
            "o": {"type": "dict", "properties": {"k": {"type": "string"}}},
        }}}
    fn = to_openai_tool(doc)["function"]
    props = fn["parameters"]["properties"]
    assert fn["name"] == "a_b" and fn["description"] == "d"
    assert fn["parameters"]["type"] == "object" and fn["parameters"]["required"] == ["x"]
    assert props["x"] == {"type": "number", "description": "num"}
    assert props["t"] == {"type": "array", "items": {"type": "integer"}}
    assert props["any"] == {"description": "anything"}
    assert props["o"]["type"] == "object" and props["o"]["properties"]["k"] == {"type": "string"}


def test_bfcl_writes_nothing_into_site_packages(simple):
    import bfcl_eval.constants.eval_config as cfg

    simple.all_tasks()
    package_parent = Path(bfcl_modules().utils.__file__).resolve().parents[1]
    assert not cfg.PROJECT_ROOT.resolve().is_relative_to(package_parent)
    assert not (package_parent / "result").exists() and not (package_parent / ".file_locks").exists()


def test_bfcl_unknown_category_lists_known():
    with pytest.raises(CoevoError, match="known: simple_python"):
        BFCLEnv("simple_cobol")


# -------------------------------------------------------------------------- BFCL multi-turn


def run_episode(env, task, turns):
    state = env.start(task)
    for i, calls in enumerate(turns):
        if i:
            assert env.next_turn(state) is not None
        if calls:
            env.step(state, calls)
    while env.next_turn(state) is not None:
        pass
    return state


def test_multi_turn_ground_truth_succeeds_empty_fails(multi):
    task = multi.all_tasks()[0]
    assert not multi.single_turn and len(task.metadata["turns"]) == len(task.answer) == 4
    assert task.messages == task.metadata["turns"][0]
    gt = multi.ground_truth_calls(task)
    s = multi.score(task, run_episode(multi, task, gt), Response())
    assert s.outcome == 1.0 and s.success, s.info
    assert s.details["state_match"] == 1.0 and s.details["calls_ok"] == 1.0
    empty = multi.score(task, run_episode(multi, task, []), Response())
    assert empty.outcome == 0.0 and "empty" in empty.info["error"]
    assert empty.details["turns_with_calls"] == 0.0


def test_multi_turn_seed_rubric_pays_the_verifiers_details(multi):
    """rubrics/function_calling_multi.yaml: outcome (weight 2) plus the checker's per-episode
    details; the ground truth gets the full reward, the first turn's calls alone the partial
    credit the details say (no criterion of its own opinion)."""
    from coevo.assets.io import load_seed_dir
    from coevo.rewards import reward, score_rubric

    [rubric] = [a for a in load_seed_dir(Path(__file__).resolve().parent.parent)
                if a.kind == "rubric" and a.name == "function_calling_multi"]
    task = multi.all_tasks()[0]
    gt = multi.ground_truth_calls(task)
    full = multi.score(task, run_episode(multi, task, gt), Response())
    crit = score_rubric(rubric, task, Response(), full)
    assert crit == {"outcome": 1.0, "turns_with_calls": 1.0, "calls_ok": 1.0, "state_match": 1.0}
    assert reward(rubric, full.outcome, crit) == 2.0
    part = multi.score(task, run_episode(multi, task, gt[:1]), Response())
    crit = score_rubric(rubric, task, Response(), part)
    d = part.details
    assert part.outcome == 0.0 and d["turns_with_calls"] == 0.25 and d["calls_ok"] == 1.0
    assert crit == {"outcome": 0.0, **{k: d[k] for k in ("turns_with_calls", "calls_ok",
                                                         "state_match")}}
    assert reward(rubric, 0.0, crit) == pytest.approx(
        (0.25 + 1.0 + d["state_match"]) / 5)


def test_multi_turn_missing_call_fails_state_check(multi):
    task = multi.all_tasks()[0]
    gt = multi.ground_truth_calls(task)
    gt[0] = gt[0][:-1]  # skip the final `mv` of turn 0: the file system differs
    s = multi.score(task, run_episode(multi, task, gt), Response())
    assert s.outcome == 0.0 and s.details["state_match"] < 1.0


def test_multi_turn_rescoring_is_repeatable(multi):
    import bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils as mu

    task = multi.all_tasks()[1]
    state = run_episode(multi, task, multi.ground_truth_calls(task))
    before = len(vars(mu))
    assert [multi.score(task, state, Response()).outcome for _ in range(3)] == [1.0, 1.0, 1.0]
    assert len(vars(mu)) == before  # the checker's cached instances were removed


def test_multi_turn_step_errors_are_observations(multi):
    task = multi.all_tasks()[0]
    state = multi.start(task)
    unknown, bad, ok = multi.step(state, [
        ToolCall(name="rm_rf", arguments={}),
        ToolCall(name="cd", arguments={"no_such_arg": 1}),
        ToolCall(name="ls", arguments={}),
    ])
    assert "unknown function" in unknown.error
    assert "bad arguments" in bad.error
    assert ok.error is None and "document" in ok.content


def test_multi_turn_unsafe_call_is_not_handed_to_checker(multi, tmp_path):
    task = multi.all_tasks()[0]
    marker = tmp_path / "pwned"
    state = multi.start(task)
    multi.step(state, [ToolCall(name="ls", arguments={f"a=open('{marker}','w'),b": 1})])
    s = multi.score(task, state, Response())
    assert not marker.exists() and s.info["dropped_calls"] == 1 and s.outcome == 0.0


def test_call_timeout():
    t0 = time.perf_counter()
    value, exc, timed_out = _run_with_timeout(lambda secs: time.sleep(secs), {"secs": 2}, 0.05)
    assert timed_out and time.perf_counter() - t0 < 1.0
    assert _run_with_timeout(lambda x: x * 2, {"x": 4}, 1.0) == (8, None, False)


def test_multi_turn_score_needs_state(multi):
    with pytest.raises(InfraError):
        multi.score(multi.all_tasks()[0], None, Response())


# ---------------------------------------------------------------------------- reasoning gym


def test_rg_right_answer_one_wrong_below():
    env = make_env("rg:basic_arithmetic?min_terms=2&max_terms=3", size=40)
    assert isinstance(env, ReasoningGymEnv) and env.single_turn and env.name.startswith("rg:")
    tasks = env.tasks("train")
    assert all(2 <= t.answer["metadata"]["num_terms"] <= 3 for t in tasks)  # kwargs applied
    task = tasks[0]
    right = env.score(task, None, Response(text=task.answer["answer"]))
    assert right.outcome == 1.0 and right.success and right.details == {"answered": 1.0, "exact": 1.0}
    wrong = env.score(task, None, Response(text=str(int(task.answer["answer"]) + 7)))
    assert wrong.outcome < 1.0 and not wrong.success and wrong.details["exact"] == 0.0
    tagged = env.score(task, None, Response(text=f"so <answer>{task.answer['answer']}</answer>"))
    assert tagged.outcome == 1.0
    assert env.score(task, None, Response(text="")).details["answered"] == 0.0


def test_rg_ids_stable_and_split_by_hash():
    a = ReasoningGymEnv("chain_sum", size=30, seed=3)
    b = ReasoningGymEnv("chain_sum", size=30, seed=3)
    assert [t.id for t in a.tasks("val")] == [t.id for t in b.tasks("val")]
    assert a.all_tasks()[5].id == "rg:chain_sum@3:5"
    ids = {s: {t.id for t in a.tasks(s)} for s in ("train", "val", "test")}
    assert sum(map(len, ids.values())) == 30 and not ids["train"] & ids["test"]


def test_rg_calculator_tool():
    env = make_env("rg:basic_arithmetic", size=10, calculator=True)
    assert not env.single_turn and env.all_tasks()[0].tools[0]["function"]["name"] == "calculator"
    good, bad, other = env.step(None, [
        ToolCall(name="calculator", arguments={"expression": "(12 + 7) * 3 / 2"}),
        ToolCall(name="calculator", arguments={"expression": "__import__('os').getcwd()"}),
        ToolCall(name="python", arguments={}),
    ])
    assert good.content == "28.5" and good.error is None
    assert bad.error and "not allowed" in bad.error
    assert "unknown tool" in other.error


@pytest.mark.parametrize("expr", ["x", "a.b", "abs(-1)", "(1).real", "[1][0]", "'1'", "2**99999",
                                  "10**10**10", "1/0", "1" * 300])
def test_calculator_refuses(expr):
    with pytest.raises(ValueError):
        calculate(expr)


def test_calculator_values():
    assert calculate("2 ** 10 - 7 // 2 + 7 % 4") == 1024 - 3 + 3
    assert calculate("-(3.5 * 2)") == -7.0


# ------------------------------------------------------------------------------------ splits


def test_splits_deterministic_disjoint_stable():
    ids = [f"task_{i}" for i in range(500)]
    spec = SplitSpec(seed=1)
    a, b = assign(ids, spec), assign(list(reversed(ids)), spec)
    assert a == b  # order of the pool does not matter
    sets = [set(v) for v in a.values()]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    assert sum(map(len, sets)) == 500
    assert [len(a[s]) for s in ("train", "val", "test")] == [len(assign(ids, spec)[s]) for s in ("train", "val", "test")]
    assert 250 < len(a["train"]) < 350  # 0.6 of 500, by hash
    # fractions: a task's split is its own; growing the pool moves nothing
    grown = assign(ids + [f"new_{i}" for i in range(100)], spec)
    assert set(a["val"]) <= set(grown["val"])
    assert all(split_of(i, spec) == "val" for i in a["val"])
    assert assign(ids, SplitSpec(seed=2)) != a


def test_split_hash_is_pinned():
    # sha256-based: the same value on every machine (a changed value would reshuffle splits)
    assert hash_unit("simple_python_0", 0) == 0.5090997348982955
    assert hash_unit("a", 7) == 0.5111364227872545


def test_split_sizes_exact_and_errors():
    ids = [f"t{i}" for i in range(100)]
    out = assign(ids, SplitSpec(sizes={"train": 50, "val": 20, "test": 10}))
    assert [len(out[s]) for s in ("train", "val", "test")] == [50, 20, 10]
    assert len(set().union(*map(set, out.values()))) == 80
    with pytest.raises(CoevoError, match="need 120"):
        assign(ids, SplitSpec(sizes={"train": 120}))
    with pytest.raises(ValueError):
        SplitSpec(fractions={"train": 0.9, "val": 0.2})
    with pytest.raises(ValueError):
        SplitSpec(fractions={"dev": 0.5})
    with pytest.raises(CoevoError, match="known: train, val, test"):
        select([], "holdout", SplitSpec())


def test_env_tasks_n_and_split_option():
    env = BFCLEnv("multiple", split={"seed": 4, "sizes": {"train": 20, "val": 10, "test": 10}})
    val = env.tasks("val")
    assert len(val) == 10 and [t.id for t in env.tasks("val", n=3)] == [t.id for t in val[:3]]
    assert not {t.id for t in val} & {t.id for t in env.tasks("test")}


# ---------------------------------------------------------------------------------- registry


def test_registry_known_kinds_in_errors():
    with pytest.raises(CoevoError, match="bfcl, bfcl-multi, jsonl, openenv, rg, textarena, verifiers"):
        make_env("gsm9k:main")
    with pytest.raises(CoevoError, match="known kinds: bfcl, bfcl-multi, jsonl, openenv, rg, textarena, verifiers"):
        make_env("no-colon")


def test_registry_builds_each_kind():
    assert make_env("bfcl:simple_python", limit=5).name == "bfcl:simple_python"
    assert make_env("bfcl-multi:multi_turn_base?limit=2").all_tasks()[1].id == "multi_turn_base_1"
    with pytest.raises(CoevoError, match="unexpected keyword"):
        make_env("bfcl:simple_python", colour="red")


PLUGIN = '''
from coevo.envs.base import Response, Score, Task

class EchoEnv:
    single_turn = True

    def __init__(self, word="hi"):
        self.name = "echo:" + word
        self.word = word

    def tasks(self, split, n=None):
        return [Task(id=split + "0", env=self.name, messages=[{"role": "user", "content": self.word}])]

    def start(self, task):
        return None

    def step(self, state, calls):
        return []

    def score(self, task, state, response):
        ok = response.text == self.word
        return Score(outcome=float(ok), success=ok)

def not_an_env():
    return 42
'''


def test_plugin_by_dotted_path(tmp_path, monkeypatch):
    (tmp_path / "coevo_test_plugin_env.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = make_env("coevo_test_plugin_env:EchoEnv?word=ping")
    assert isinstance(env, Environment) and env.name == "echo:ping"
    task = env.tasks("val")[0]
    assert env.score(task, None, Response(text="ping")).outcome == 1.0
    with pytest.raises(CoevoError, match="lacks"):
        make_env("coevo_test_plugin_env:not_an_env")
    with pytest.raises(CoevoError, match="no attribute"):
        make_env("coevo_test_plugin_env:Missing")
    sys.modules.pop("coevo_test_plugin_env", None)


def test_register_custom_kind():
    @register_env("test-echo")
    def _factory(arg, **opts):
        return ReasoningGymEnv(arg, size=5, **opts)

    try:
        assert make_env("test-echo:chain_sum").name == "rg:chain_sum"
        assert "test-echo" in ENV_KINDS.names()
    finally:
        ENV_KINDS._items.pop("test-echo")


def test_multi_turn_miss_func_adds_tools_at_its_turn():
    env = BFCLMultiEnv("multi_turn_miss_func", limit=1)
    task = env.all_tasks()[0]
    names = lambda tools: {t["function"]["name"] for t in tools}  # noqa: E731
    assert "sort" not in names(task.tools) and list(task.metadata["missed_function"]) == ["3"]
    state = env.start(task)
    assert [env.next_turn(state) is not None for _ in range(2)] == [True, True]
    assert "sort" not in names(state.tools)
    assert env.next_turn(state)[0]["content"].startswith("I have updated some more functions")
    assert "sort" in names(state.tools)
    gt = env.ground_truth_calls(task)
    assert env.score(task, run_episode(env, task, gt), Response()).outcome == 1.0


def test_split_duplicate_ids_refused():
    with pytest.raises(CoevoError, match="'a' occurs more than once"):
        assign(["a", "b", "a"], SplitSpec())


def test_bfcl_system_prompt_is_bfcls_own(simple):
    from coevo.envs.bfcl import bfcl_system_prompt

    text = bfcl_system_prompt(by_id(simple, "simple_python_1").metadata["functions"])
    assert "math.factorial" in text and "[func_name1(params_name1=params_value1" in text


# ------------------------------------------------------------------- BFCL decoding parity

PARITY = [
    "[f(a=1)]", "f(a=1)", "```\n[f(a=1)]\n```", "[f(a=1), g(b='x')]", "[math.factorial(number=5)]",
    "Sure! [f(a=1)]", "[f(a=1)] thanks", "The answer is 4.", "[f(True)]", "[f(a=1)", "[]",
    "[f(a=-1)]", "[f(a=+1)]", "[f(a=not True)]", "[f(a=(1, 2))]", "[f(a=[1, {'k': 'v'}])]",
    "[f(a=x)]", "[f(a=g(1))]", "[f(a=g(b=1))]", "[f(a=2*3+1)]", "[f(a=d['k'])]", "[f(a=...)]",
    "(f(a=1), g(b=2))", "'[f(a=1)]'", "[f(a={1, 2})]", "[f(a=math.pi)]", "[f(a=lambda: 1)]",
    "[1, f(a=1)]", "[f(a=1)]\n[g(b=2)]", "[f(**{'a': 1})]",
]


@pytest.mark.parametrize("text", PARITY)
def test_bfcl_decoder_parity_with_bfcls_own(text):
    """coevo's AST-only reproduction of BFCL's default_decode_ast_prompting decodes (or fails
    to decode) exactly what BFCL's does: prose around the list fails, positional arguments
    are dropped, BFCL's quirks (`+1` -> -1, tuples kept) kept."""
    bfcl_modules()  # first: BFCL imported the way the environment imports it (no site-packages writes)
    from bfcl_eval.constants.enums import ReturnFormat
    from bfcl_eval.model_handler.utils import default_decode_ast_prompting

    from coevo.envs.bfcl_decode import bfcl_decode
    try:
        want = default_decode_ast_prompting(text, ReturnFormat.PYTHON)
    except Exception:  # noqa: BLE001 - BFCL's decoder raises anything; all are failures
        want = None
    assert bfcl_decode(text) == want


def test_bfcl_decoder_departs_only_where_bfcl_would_eval_model_text():
    """BFCL evals arithmetic on strings; coevo folds numbers only and never runs model text."""
    from coevo.envs.bfcl_decode import bfcl_decode

    assert bfcl_decode("[f(a='x' + 'y')]") is None  # BFCL: {"f": {"a": "xy"}} via eval
    assert bfcl_decode("[f(a=2**10)]") == [{"f": {"a": 1024}}]


def test_bfcl_accuracy_decodes_as_bfcl_and_reports_the_lenient_parse_apart(simple):
    """The outcome decodes the final text as BFCL does; the harness's lenient parse (prose
    around the call is tolerated, positional arguments refused) is its own detail."""
    task = by_id(simple, "simple_python_0")  # calculate_triangle_area(base=10, height=5)
    right = '[calculate_triangle_area(base=10, height=5)]'

    def verdict(text, env=simple):
        parsed = parse_tool_calls(text, "python")
        return env.score(task, None, Response(text=text, tool_calls=parsed.calls,
                                              parse_error=parsed.error))

    for text in (f"Sure! {right}", f"{right} thanks"):
        s = verdict(text)
        assert (s.outcome, s.details["bfcl_decodes"]) == (0.0, 0.0)
        assert (s.details["decodes"], s.details["lenient_correct"]) == (1.0, 1.0)
    s = verdict(right)
    assert (s.outcome, s.details["bfcl_decodes"], s.details["lenient_correct"]) == (1.0, 1.0, 1.0)
    s = verdict("[calculate_triangle_area(10, 5)]")  # BFCL drops positionals: decodes, wrong
    assert (s.outcome, s.details["bfcl_decodes"], s.details["decodes"]) == (0.0, 1.0, 0.0)
    assert s.info["decoded"] == [{"calculate_triangle_area": {}}]
    lenient = BFCLEnv("simple_python", decode="harness")
    assert lenient.name == "bfcl:simple_python?decode=harness"
    assert verdict(f"Sure! {right}", lenient).outcome == 1.0
