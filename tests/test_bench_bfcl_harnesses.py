"""bench/bfcl_harnesses.py measures the agent the co-evolution bench runs when asked:
`--skills seed` shows the seed skill library, as a run config naming `skill_library: seed`
does; without it the harness is measured alone."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import bfcl_harnesses  # noqa: E402

from coevo.envs.callparse import python_call_text  # noqa: E402
from coevo.envs.registry import make_env  # noqa: E402
from coevo.models.scripted import ScriptedBackend  # noqa: E402


def test_seed_skills_reach_the_prompt_and_the_cell_scores_the_answers():
    env = make_env("bfcl:simple_python")
    tasks = env.tasks("train", n=3)
    harness = bfcl_harnesses.load_harness("function_calling")

    def answer(req, i):
        text = "\n".join(m["content"] for m in req.messages)
        task = next(t for t in tasks if t.messages[0]["content"] in text)
        [item] = task.answer
        [(name, params)] = item.items()
        args = {k: v[0] for k, v in params.items() if v and v[0] != ""}
        return "[" + python_call_text(name, args) + "]"

    skills, library = bfcl_harnesses.seed_skills()
    assert library.name == "seed" and {s.name for s in skills} >= {"function-call-format"}
    shown = {}
    for which, arg in (("none", ([], None)), ("seed", (skills, library))):
        backend = ScriptedBackend(answer)
        rows = bfcl_harnesses.run_cell(env, tasks, harness, backend, "greedy", "simple_python",
                                       arg)
        assert [r["outcome"] for r in rows] == [1.0, 1.0, 1.0]
        system = [r.messages[0]["content"] for r in backend.requests]
        shown[which] = sum("## Skill: " in s for s in system)
    assert shown == {"none": 0, "seed": 3}
