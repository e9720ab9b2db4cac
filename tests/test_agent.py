"""The harness runtime: token sequence (context.py), tools (tools.py), graph and episodes."""

from __future__ import annotations

import asyncio
import functools
import os
import time
from pathlib import Path

import pytest

from coevo.agent.context import TokenSequence
from coevo.agent.tools import execute, resolve_tools
from coevo.models.base import Completion, Sampling
from coevo.trajectory import ToolCall

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# A template that trims assistant content, as many real ones do: the sampled text then is not a
# prefix of the re-rendered conversation, which the sequence builder must splice around.
TRIMMING = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{{ m['content'] | trim }}{% else %}{{ m['content'] }}"
    "{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@functools.lru_cache(maxsize=4)
def tiny_tokenizer(template: str = CHATML, ascii_only: bool = False):
    """A real byte-level BPE tokenizer (400 ids) with a ChatML template, built in code."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if ascii_only:
        # Printable ASCII + space + newline only, so every id a random model samples decodes
        # to whole characters (no half UTF-8 sequences); other characters are dropped.
        keep = {chr(b) for b in range(33, 127)} | {chr(256 + 32), chr(256 + 10)}
        alphabet = sorted(c for c in alphabet if c in keep)
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=alphabet, show_progress=False)
    corpus = ['{"name": "get_weather", "arguments": {"city": "Paris"}}', "system user tool",
              "assistant The answer is 42. calculator expression python code print"]
    tok.train_from_iterator(corpus * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", chat_template=template)


def scripted_completion(tokenizer, text: str, *, eos: bool = True) -> Completion:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if eos:
        ids.append(tokenizer.eos_token_id)
    # distinct logprobs per position, so misalignment would show
    lps = [-0.01 * (k + 1) for k in range(len(ids))]
    return Completion(text=text, token_ids=ids, logprobs=lps)


# -- token sequence ---------------------------------------------------------------------------
@pytest.mark.parametrize("template", [CHATML, TRIMMING])
@pytest.mark.parametrize("eos", [True, False])
def test_token_sequence_masks_only_sampled_ids(template, eos):
    tok = tiny_tokenizer(template)
    seq = TokenSequence(tok, [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "Weather in Paris?"}])
    prompt = list(seq.ids)
    assert prompt == tok.encode(tok.apply_chat_template(
        seq.messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
    assert seq.prompt_len == len(prompt) and set(seq.mask) == {0}

    spans = []
    for text in [' {"name": "get_weather", "arguments": {"city": "Paris"}} ', "It is sunny."]:
        req = seq.request(Sampling())
        assert req.prompt_ids == seq.ids  # the next request continues the exact sequence
        c = scripted_completion(tok, text, eos=eos)
        start, end = seq.add_completion(c)
        assert seq.ids[start:end] == c.token_ids and seq.logprobs[start:end] == c.logprobs
        spans.append((start, end))
        seq.add_observation([{"role": "tool", "content": "sunny, 21C"}])
        seq.flush()
    assert len(seq.ids) == len(seq.mask) == len(seq.logprobs)
    sampled = {i for s, e in spans for i in range(s, e)}
    assert {i for i, m in enumerate(seq.mask) if m} == sampled
    assert all(seq.logprobs[i] == 0.0 for i in range(len(seq.ids)) if i not in sampled)
    # Observation tokens are the template's own text: the decoded sequence reads as a chat.
    decoded = tok.decode(seq.ids, skip_special_tokens=False)
    assert decoded.count("<|im_start|>tool\nsunny, 21C<|im_end|>\n") == 2
    assert decoded.endswith("<|im_start|>assistant\n")
    # One end-of-turn per assistant turn, whether sampled or added by the observation.
    assert decoded.count("<|im_end|>") == 2 + 2 * 2


def test_token_sequence_without_tokenizer_keeps_messages():
    seq = TokenSequence(None, [{"role": "user", "content": "hi"}])
    seq.add_completion(Completion(text="hello", trainable=False))
    seq.add_observation([{"role": "tool", "content": "x"}])
    req = seq.request(Sampling())
    assert req.prompt_ids is None and [m["role"] for m in req.messages] == ["user", "assistant",
                                                                           "tool"]
    assert seq.ids == [] and not seq.trainable


# -- tools ------------------------------------------------------------------------------------
def _run(call, timeout=2.0):
    return asyncio.run(execute(call, resolve_tools(["calculator", "python"]), timeout))


def test_calculator_and_python_tools_compute(bwrap):
    r = _run(ToolCall(name="calculator", arguments={"expression": "2 * (3 + 4) ** 2"}))
    assert (r.content, r.error) == ("98", None)
    r = _run(ToolCall(name="python", arguments={"code": "print(sum(range(101)))"}))
    assert (r.content.strip(), r.error) == ("5050", None)


def _running_children(word: str) -> list[int]:
    """Child processes of this one whose command line has `word` and that are on a CPU."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError):
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == os.getpid() and fields[0] == "R" and word in cmd:
            out.append(int(d.name))
    return out


def test_calculator_timeout_stops_the_computation():
    """factorial(10**6) takes about 7 s: a 1 s timeout must stop it, not leave it running (the
    tool used to compute in a thread, which went on, and held the episode's end)."""
    t0 = time.perf_counter()
    r = _run(ToolCall(name="calculator", arguments={"expression": "factorial(10**6)"}), timeout=1.0)
    wall = time.perf_counter() - t0
    assert r.error == "timeout: calculator: no result within 1s" and wall < 3.0
    cpu = time.process_time()
    time.sleep(1.0)
    assert time.process_time() - cpu < 0.3  # no thread of ours still computing
    assert _running_children("calculator") == []  # and no worker either
    # the pool replaces the killed worker; errors come back as observations
    r = _run(ToolCall(name="calculator", arguments={"expression": "2 ** 10 + factorial(5)"}))
    assert (r.content, r.error) == ("1144", None)
    r = _run(ToolCall(name="calculator", arguments={"expression": "1 / 0"}))
    assert r.error == "division by zero"


def test_tool_failures_become_observations(bwrap):
    r = _run(ToolCall(name="python", arguments={"code": "import time\ntime.sleep(30)"}),
             timeout=0.5)
    assert r.error.startswith("timeout") and r.seconds < 5
    r = _run(ToolCall(name="python", arguments={"code": "raise ValueError('boom')"}))
    assert "ValueError: boom" in r.error and r.content.startswith("Error:")
    r = _run(ToolCall(name="calculator", arguments={"expression": "__import__('os')"}))
    assert "unsupported" in r.error
    r = _run(ToolCall(name="calculator", arguments={"expr": "1"}))
    assert "'expression' is a required property" in r.error
    r = _run(ToolCall(name="search", arguments={}))
    assert "unknown tool 'search'" in r.error and "calculator" in r.error


# -- graph and episodes -----------------------------------------------------------------------
import json  # noqa: E402

from coevo.agent.episode import run_episodes, run_episodes_sync, sample_seed  # noqa: E402
from coevo.assets.harness import Harness  # noqa: E402
from coevo.assets.rubric import Rubric  # noqa: E402
from coevo.envs.base import Response, Score, Task  # noqa: E402
from coevo.models.scripted import ScriptedBackend  # noqa: E402
from coevo.trajectory import ToolResult  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current temperature of a city in Celsius.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TEMPS = {"Paris": 21, "Oslo": 4, "Lima": 18, "Cairo": 35}


class WeatherEnv:
    """A multi-turn environment: get_weather is executed against a small table; the answer
    must state the temperature."""

    name = "test:weather"
    single_turn = False

    def __init__(self):
        self.steps = 0

    def tasks(self, split="train", n=None):
        out = [Task(id=f"w-{c}", env=self.name, messages=[
            {"role": "user", "content": f"How warm is it in {c}?"}], tools=[WEATHER], answer=t)
            for c, t in TEMPS.items()]
        return out[:n]

    def start(self, task):
        return {"calls": []}

    def step(self, state, calls):
        self.steps += 1
        state["calls"].extend(calls)
        out = []
        for c in calls:
            if c.arguments.get("city") == "Boom":
                raise RuntimeError("weather service down")
            t = TEMPS.get(c.arguments.get("city"))
            out.append(ToolResult(name=c.name, content=f"{t} C" if t is not None else "unknown city",
                                  error=None if t is not None else "unknown city"))
        return out

    def score(self, task, state, response: Response) -> Score:
        ok = str(task.answer) in response.text
        return Score(outcome=float(ok), success=ok,
                     details={"called": float(bool(state["calls"]))})


def weather_harness(**kw) -> Harness:
    data = dict(name="weather", system_prompt="Answer with the help of tools.",
                tool_format="json", workflow={"max_turns": 4},
                decoding={"temperature": 0.0, "max_new_tokens": 64})
    data.update(kw)
    return Harness.model_validate(data)


def weather_script(request, index):
    """A policy that calls get_weather for the city in the question, then answers."""
    text = TOK_TEXT(request)
    city = next(c for c in TEMPS if f"How warm is it in {c}?" in text)
    if "<|im_start|>tool" not in text:
        return json.dumps({"name": "get_weather", "arguments": {"city": city}})
    temp = text.rsplit("<|im_start|>tool\n", 1)[1].split(" C", 1)[0]
    return f"It is {temp} degrees in {city}."


def TOK_TEXT(request):
    return tiny_tokenizer().decode(request.prompt_ids, skip_special_tokens=False)


def test_multi_turn_episode_masks_and_scores():
    env, tok = WeatherEnv(), tiny_tokenizer()
    backend = ScriptedBackend(weather_script, tok)
    [traj] = run_episodes_sync(env, env.tasks(n=1), weather_harness(), backend=backend)
    assert traj.status == "ok" and traj.outcome == 1.0 and traj.reward == 1.0
    assert traj.answer == "It is 21 degrees in Paris." and len(traj.turns) == 2
    assert traj.turns[0].tool_calls[0].arguments == {"city": "Paris"}
    assert traj.turns[0].tool_results[0].content == "21 C"
    # mask invariant: mask 1 exactly on the turns' sampled spans; those ids are the sampled ids
    sampled = [i for t in traj.turns for i in range(t.start, t.end)]
    assert [i for i, m in enumerate(traj.loss_mask) if m] == sampled
    for t in traj.turns:
        ids = traj.token_ids[t.start:t.end]
        assert ids == tok.encode(t.text, add_special_tokens=False) + [tok.eos_token_id]
        assert traj.logprobs[t.start:t.end] == [-1.0] * len(ids)
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask) if not m)
    assert traj.prompt_len == traj.turns[0].start and sum(traj.loss_mask[:traj.prompt_len]) == 0
    # every request after the first continued the exact sequence so far
    second = backend.requests[1].prompt_ids
    assert second == traj.token_ids[:traj.turns[1].start]
    assert "<|im_start|>tool\n21 C<|im_end|>" in tok.decode(traj.token_ids)
    assert traj.harness == weather_harness().hash and traj.model == "scripted"


def test_tool_timeout_exception_and_unknown_tool_become_observations(bwrap):
    env, tok = WeatherEnv(), tiny_tokenizer()
    harness = weather_harness(
        tools=[{"function": {"name": "python", "description": "run code", "parameters": {
            "type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}],
        workflow={"max_turns": 5, "reflect_on_tool_error": True,
                  "reflection_prompt": "REFLECT: fix the call."})
    steps = [
        json.dumps({"name": "python", "arguments": {"code": "import time\ntime.sleep(30)"}}),
        json.dumps({"name": "get_weather", "arguments": {"city": "Boom"}}),
        json.dumps({"name": "web_search", "arguments": {"q": "x"}}),
        '{"name": "get_weather", "arguments": {"city": ',  # unreadable call
        "It is 21 degrees.",
    ]
    backend = ScriptedBackend(lambda req, i: steps[i], tok)
    [traj] = run_episodes_sync(env, env.tasks(n=1), harness, backend=backend, tool_timeout=0.5)
    assert traj.status == "ok" and traj.outcome == 1.0 and len(traj.turns) == 5
    t0, t1, t2, t3 = traj.turns[:4]
    assert t0.tool_results[0].error.startswith("timeout") and t0.tool_results[0].seconds < 5
    assert "RuntimeError: weather service down" in t1.tool_results[0].error
    assert "unknown tool 'web_search'" in t2.tool_results[0].error
    assert t3.parse_error and not t3.tool_calls
    decoded = tok.decode(traj.token_ids)
    assert decoded.count("REFLECT: fix the call.") == 4  # after each failing step
    assert "could not be parsed" in decoded
    assert [i for i, m in enumerate(traj.loss_mask) if m] == [
        i for t in traj.turns for i in range(t.start, t.end)]


def test_error_completion_is_infra_error_not_zero():
    env, tok = WeatherEnv(), tiny_tokenizer()
    backend = ScriptedBackend([json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})],
                              tok)  # the second turn finds the script exhausted: an error
    rubric = Rubric.model_validate({"name": "r", "criteria": [
        {"id": "called", "kind": "outcome", "params": {"detail": "called"}}]})
    [traj] = run_episodes_sync(env, env.tasks(n=1), weather_harness(), rubric=rubric,
                               backend=backend)
    assert traj.status == "infra_error" and "script exhausted" in traj.error
    assert traj.outcome is None and traj.reward is None and traj.criteria == {}
    assert len(traj.turns) == 1 and not traj.trainable


def test_single_turn_bfcl_possible_answer_scores_one_and_wrong_argument_zero():
    from coevo.envs.callparse import python_call_text
    from coevo.envs.registry import make_env

    env = make_env("bfcl:simple_python")
    tasks = env.tasks("train", n=4)

    def answer(task, wrong=False):
        [item] = task.answer
        [(name, params)] = item.items()
        args = {k: v[0] for k, v in params.items() if v and v[0] != ""}
        if wrong:
            k = next(iter(args))
            args[k] = "definitely wrong" if not isinstance(args[k], str) else 987654
        return "[" + python_call_text(name, args) + "]"

    harness = Harness.model_validate(dict(
        name="bfcl", system_prompt="Call the function.", tool_format="python",
        decoding={"temperature": 0.0, "max_new_tokens": 256}))
    rubric = Rubric.model_validate({"name": "bfcl", "criteria": [
        {"id": "named", "kind": "tool_called", "params": {"name_in_offered": True}},
        {"id": "args", "kind": "tool_called", "params": {"args_match": True}}]})
    by_prompt = {t.messages[0]["content"]: t for t in tasks}
    for wrong in (False, True):
        def script(req, i, wrong=wrong):
            text = TOK_TEXT(req)
            task = next(t for q, t in by_prompt.items() if q in text)
            return answer(task, wrong)
        trajs = run_episodes_sync(env, tasks, harness, rubric=rubric,
                                  backend=ScriptedBackend(script, tiny_tokenizer()))
        assert [t.outcome for t in trajs] == [0.0 if wrong else 1.0] * len(tasks)
        assert all(t.status == "ok" and len(t.turns) == 1 for t in trajs)
        assert all(t.criteria["named"] == 1.0 for t in trajs)
        assert all((t.criteria["args"] < 1.0) == wrong for t in trajs)
        assert all(t.turns[0].tool_results == [] for t in trajs)  # scored, not executed


@functools.lru_cache(maxsize=1)
def tiny_model_backend():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from coevo.models.hf import HFBackend

    torch.manual_seed(0)
    tok = tiny_tokenizer(ascii_only=True)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=1024, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, bos_token_id=None)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # sharper than uniform: samples differ by seed
    return HFBackend(model, tok, name="tiny-llama", max_batch=64)


class CountingBackend:
    """Wraps a backend and records the size of every generate call."""

    def __init__(self, inner):
        self.inner, self.name, self.tokenizer = inner, inner.name, inner.tokenizer
        self.calls: list[int] = []

    def generate(self, requests):
        self.calls.append(len(requests))
        return self.inner.generate(requests)


def test_same_seeds_give_identical_trajectories_and_seeds_pair_across_harnesses():
    env = WeatherEnv()
    h = weather_harness(decoding={"temperature": 1.0, "max_new_tokens": 12},
                        workflow={"max_turns": 1})
    tasks = env.tasks(n=2)
    a = run_episodes_sync(env, tasks, h, backend=tiny_model_backend(), samples=2, seeds=7)
    b = run_episodes_sync(env, tasks, h, backend=tiny_model_backend(), samples=2, seeds=7)
    c = run_episodes_sync(env, tasks, h, backend=tiny_model_backend(), samples=2, seeds=8)
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    assert [t.seed for t in a] == [sample_seed(7, t.task_id, t.sample_index) for t in a]
    assert [t.token_ids for t in a] != [t.token_ids for t in c]
    assert len({t.seed for t in a}) == 4 and a[0].group_id == a[1].group_id != a[2].group_id
    # a different harness (another arm of the gate) draws the same per-sample seeds
    other = weather_harness(system_prompt="Be terse.",
                            decoding={"temperature": 1.0, "max_new_tokens": 12})
    d = run_episodes_sync(env, tasks, other, backend=tiny_model_backend(), samples=2, seeds=7)
    assert [t.seed for t in d] == [t.seed for t in a] and d[0].harness != a[0].harness
    for t in a:
        assert t.sampled_tokens == t.turns[0].end - t.turns[0].start > 0


def test_sixteen_concurrent_episodes_share_batched_calls():
    env, tok = WeatherEnv(), tiny_tokenizer()
    backend = CountingBackend(ScriptedBackend(weather_script, tok))
    tasks = env.tasks()  # 4 tasks
    trajs = asyncio.run(run_episodes(env, tasks, weather_harness(), backend=backend,
                                     samples=4))  # 16 episodes, 2 turns each
    assert len(trajs) == 16 and all(t.outcome == 1.0 for t in trajs)
    assert sum(backend.calls) == 32
    assert len(backend.calls) <= 2 * 2, backend.calls  # <= 2 batched calls per turn


def test_sixteen_concurrent_sampled_episodes_on_tiny_model():
    env = WeatherEnv()
    backend = CountingBackend(tiny_model_backend())
    h = weather_harness(decoding={"temperature": 1.0, "max_new_tokens": 8},
                        workflow={"max_turns": 1})
    trajs = run_episodes_sync(env, env.tasks(n=2), h, backend=backend, samples=8)
    assert len(trajs) == 16 and len(backend.calls) <= 2, backend.calls
    for t in trajs:
        span = t.turns[0]
        assert t.loss_mask[span.start:span.end] == [1] * (span.end - span.start)
        assert sum(t.loss_mask) == span.end - span.start and span.end - span.start >= 1
        assert all(lp < 0 for lp in t.logprobs[span.start:span.end])


@pytest.mark.slow
def test_embedded_model_on_eight_bfcl_tasks_end_to_end():
    from coevo.envs.registry import make_env
    from coevo.models.registry import load_backend

    env, backend = make_env("bfcl:simple_python"), load_backend("embedded")
    tasks = env.tasks("train", n=8)
    harness = Harness.model_validate(dict(
        name="bfcl-embedded", system_prompt="Answer with a Python function call list.",
        tool_format="python", decoding={"temperature": 0.0, "max_new_tokens": 48}))
    rubric = Rubric.model_validate({"name": "r", "criteria": [
        {"id": "named", "kind": "tool_called", "params": {"name_in_offered": True}}]})
    trajs = run_episodes_sync(env, tasks, harness, rubric=rubric, backend=backend)
    tok = backend.tokenizer
    assert [t.task_id for t in trajs] == [t.id for t in tasks]
    for t, task in zip(trajs, tasks):
        assert t.status == "ok" and t.trainable and t.outcome in (0.0, 1.0)
        assert t.model == backend.name and "named" in t.criteria and t.reward is not None
        [turn] = t.turns
        assert turn.end == len(t.token_ids) and turn.start == t.prompt_len
        assert t.loss_mask == [0] * t.prompt_len + [1] * (turn.end - turn.start)
        assert all(lp <= 0 for lp in t.logprobs[turn.start:]) and any(t.logprobs[turn.start:])
        assert task.messages[0]["content"] in tok.decode(t.token_ids[:t.prompt_len])


class TwoQuestionEnv(WeatherEnv):
    """Two user turns (as BFCL multi-turn has): the second question comes via next_turn."""

    name = "test:two-questions"

    def start(self, task):
        return {"calls": [], "asked": 1}

    def next_turn(self, state):
        if state["asked"] >= 2:
            return None
        state["asked"] += 1
        return [{"role": "user", "content": "How warm is it in Oslo?"}]

    def score(self, task, state, response: Response) -> Score:
        ok = state["asked"] == 2 and "4 degrees in Oslo" in response.text
        return Score(outcome=float(ok), success=ok)


def two_question_script(request, index):
    text = TOK_TEXT(request)
    last_user = text.rsplit("<|im_start|>user\n", 1)[1]
    city = next(c for c in TEMPS if f"How warm is it in {c}?" in last_user)
    if "<|im_start|>tool" not in last_user:
        return json.dumps({"name": "get_weather", "arguments": {"city": city}})
    temp = last_user.rsplit("<|im_start|>tool\n", 1)[1].split(" C", 1)[0]
    return f"It is {temp} degrees in {city}."


def test_next_user_turn_continues_the_episode_with_mask_zero():
    env, tok = TwoQuestionEnv(), tiny_tokenizer()
    backend = ScriptedBackend(two_question_script, tok)
    [traj] = run_episodes_sync(env, env.tasks(n=1), weather_harness(workflow={"max_turns": 8}),
                               backend=backend)
    assert traj.status == "ok" and traj.outcome == 1.0
    # call, answer, (next user turn), call, answer
    assert [bool(t.tool_calls) for t in traj.turns] == [True, False, True, False]
    assert traj.turns[2].tool_calls[0].arguments == {"city": "Oslo"}
    text = tok.decode(traj.token_ids)
    assert "<|im_start|>user\nHow warm is it in Oslo?<|im_end|>" in text
    # the second question's tokens were not sampled by the policy
    q_start = traj.turns[1].end
    assert sum(traj.loss_mask[q_start:traj.turns[2].start]) == 0
    assert [i for i, m in enumerate(traj.loss_mask) if m] == [
        i for t in traj.turns for i in range(t.start, t.end)]
