"""A small store for the reviewer app's tests (test_serve.py, test_serve_browser.py): real
co-evolution runs (the loop, gate, evaluate() and store; harness-only mode, no training) of a
scripted policy on a multi-turn tool environment, with scripted proposals whose fate is known:

round 0: TOOL (accepted: the policy calls the lookup tool and answers on odd tasks),
         STYLE (rejected: no effect, ties everywhere; its rationale carries HTML),
         RENAME (invalid: changes a field no proposal may change);
round 1: TERSE (rejected: wins on tasks 0 and 6, loses on 1, 5, 7 and 11, ties on the rest);
round 2: WORD (accepted: right on every task).

So the final harness's system prompt has three lines: "Reply briefly." (seed), "Use the lookup
tool." (TOOL, round 0), "Answer with the code word only." (WORD, round 2). A second, shorter
run ("review-short") gives the runs comparison a second curve.
"""

from __future__ import annotations

import re
from pathlib import Path

from coevo.assets.rubric import Rubric
from coevo.config import RunConfig
from coevo.envs.base import Response, Score, Task
from coevo.loop import Parts, run_coevolution
from coevo.models.scripted import ScriptedBackend
from coevo.propose import make_proposer
from coevo.store import Store
from coevo.trajectory import ToolResult

import tiny_glue

SEED_PROMPT = "Reply briefly."
TOOL_LINE, TERSE_LINE, WORD_LINE = ("Use the lookup tool.", "Be terse.",
                                     "Answer with the code word only.")
XSS = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"
TOOL = {"kind": "harness", "round": 0, "rationale": "the tasks need the lookup tool",
        "predicted_effect": "+50pp on val",
        "changes": {"system_prompt": f"{SEED_PROMPT}\n{TOOL_LINE}"}}
STYLE = {"kind": "harness", "round": 0, "changes": {"answer_format": "Be kind."},
         "rationale": f"friendlier answers {XSS}", "predicted_effect": "none on outcome"}
RENAME = {"kind": "harness", "round": 0, "changes": {"name": "renamed"}, "rationale": "rename"}
TERSE = {"kind": "harness", "round": 1, "rationale": "shorter replies",
         "changes": {"system_prompt": f"{SEED_PROMPT}\n{TOOL_LINE}\n{TERSE_LINE}"}}
WORD = {"kind": "harness", "round": 2, "rationale": "say only the code word",
        "predicted_effect": "+50pp",
        "changes": {"system_prompt": f"{SEED_PROMPT}\n{TOOL_LINE}\n{WORD_LINE}"}}
TERSE_WINS, TERSE_LOSSES = {"val-0", "val-6"}, {"val-1", "val-5", "val-7", "val-11"}


class CodeWordEnv:
    """Multi-turn: a `lookup` tool returns the task's code word; the answer must contain it.
    `details["called"]` (the rubric's partial credit) is 1 when the tool was called."""

    name = "test:code-word"
    single_turn = False
    TOOL = {"type": "function", "function": {
        "name": "lookup", "description": "The code word for a key.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                       "required": ["key"]}}}

    def tasks(self, split: str = "val", n: int | None = None) -> list[Task]:
        out = [Task(id=f"{split}-{i}", env=self.name, tools=[self.TOOL], answer=f"code-{i}",
                    messages=[{"role": "user", "content": f"What is the code word for key {i}?"}])
               for i in range(12)]
        return out[:n] if n is not None else out

    def start(self, task):
        return {"calls": 0}

    def step(self, state, calls):
        state["calls"] += len(calls)
        return [ToolResult(name=c.name, content=f"code-{c.arguments.get('key', '?')}") for c in calls]

    def score(self, task: Task, state, response: Response) -> Score:
        ok = task.answer in response.text
        return Score(outcome=float(ok), success=ok, details={"called": float(state["calls"] > 0)})


def passes(prompt: str, i: int) -> bool:
    """Whether the scripted policy answers task i right under a system prompt."""
    if WORD_LINE in prompt:
        return True
    if TERSE_LINE in prompt:
        return i % 3 == 0
    return TOOL_LINE in prompt and i % 2 == 1


def policy(request, index):
    text = tiny_glue.tiny_tokenizer().decode(request.prompt_ids, skip_special_tokens=False)
    i = int(re.search(r"code word for key (\d+)\?", text).group(1))
    if TOOL_LINE not in text:
        return "I do not know."
    if "<|im_start|>tool" not in text:
        return f'{{"name": "lookup", "arguments": {{"key": "{i}"}}}}'
    return f"The code word is code-{i}." if passes(text, i) else "The code word is unknown."


RUBRIC = Rubric.model_validate({"name": "code", "criteria": [
    {"id": "called", "kind": "outcome", "params": {"detail": "called"}}]})


def config(name: str, candidates: list[dict], rounds: int, harness: str,
           human_review: bool = False) -> RunConfig:
    return RunConfig.from_mapping({
        "name": name, "env": "test:code-word", "mode": "harness-only", "rounds": rounds,
        "assets": {"harness": harness, "rubric": "code"},
        "proposers": [{"name": "scripted", "options": {"candidates": candidates}}],
        "gate": {"screen_size": 12, "n_boot": 200, "human_review": human_review},
        "splits": {"val_n": 12, "test_n": 6, "train_n": 2, "train_samples": 1},
    })


def build_store(path: Path) -> tuple[str, dict[str, str]]:
    """Write the two runs into a SQLite store at `path`; returns (its URL, the main run's
    proposal ids by name: tool, style, rename, terse, word)."""
    url = f"sqlite:///{path}"
    store = Store.open(url)
    seed = _seed(store)
    for name, cands, rounds in (("review-demo", [TOOL, STYLE, RENAME, TERSE, WORD], 3),
                                ("review-short", [TOOL], 2)):
        _run(store, config(name, cands, rounds, seed))
    by_rationale = {p.rationale: p.id for p in store.proposals("review-demo")}
    ids = {k: by_rationale[c["rationale"]] for k, c in
           (("tool", TOOL), ("style", STYLE), ("rename", RENAME), ("terse", TERSE), ("word", WORD))}
    store.close()
    return url, ids


def _seed(store: Store) -> str:
    # Every run starts from the seed by hash: by name, "tiny" would be the first run's result.
    seed = store.put_asset(tiny_glue.tiny_harness(
        workflow={"max_turns": 3}, decoding={"temperature": 0.0, "max_new_tokens": 40}))
    store.put_asset(RUBRIC)
    return seed


def _run(store: Store, cfg: RunConfig, resume: str | None = None) -> None:
    parts = Parts(env=CodeWordEnv(), backend=ScriptedBackend(policy, tiny_glue.tiny_tokenizer()),
                  proposers=[make_proposer(p.name, **p.options) for p in cfg.proposers])
    run_coevolution(cfg, store, parts, resume=resume)


def resume_run(store: Store, cfg: RunConfig) -> None:
    """Continue the run named in `cfg` (e.g. with more rounds)."""
    _run(store, cfg, resume=cfg.name)


def build_held_store(path: Path) -> tuple[str, dict[str, str]]:
    """A store whose one-round run ("review-held") has gate.human_review on: TOOL passed the
    gate and is held pending review, STYLE was rejected. Returns (URL, ids: tool, style)."""
    url = f"sqlite:///{path}"
    store = Store.open(url)
    _run(store, config("review-held", [TOOL, STYLE], 1, _seed(store), human_review=True))
    by_rationale = {p.rationale: p.id for p in store.proposals("review-held")}
    ids = {"tool": by_rationale[TOOL["rationale"]], "style": by_rationale[STYLE["rationale"]]}
    store.close()
    return url, ids
