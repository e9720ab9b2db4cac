"""Skill activation: which skills of the library enter a task's context.

Agent Skills are meant to be loaded by relevance, from their `name` and `description` only
(the body is what gets loaded). Relevance here is Okapi BM25 (coevo/agent/bm25.py: Lucene idf,
identifier-splitting tokenizer, since documents are tiny: a name and one sentence).

Departure: a skill must match at least one query term to be activated: BM25 top-k alone would
fill the k slots with irrelevant skills.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from coevo.agent.bm25 import BM25, tokenize  # noqa: F401  (tokenize: re-exported)

METHODS = ("bm25", "all", "none")


class SkillLike(Protocol):
    name: str
    description: str
    state: str


def skill_query(task_messages: list[dict[str, Any]], task_tools: list[dict[str, Any]]) -> str:
    """What a task says about itself: its user messages plus the offered functions' names and
    descriptions (a BFCL question alone may not name the domain; its function does)."""
    parts = [str(m.get("content") or "") for m in task_messages if m.get("role") == "user"]
    for spec in task_tools:
        inner = spec.get("function", spec) if isinstance(spec.get("function"), dict) else spec
        parts.append(f"{inner.get('name', '')} {inner.get('description', '')}")
    return "\n".join(parts)


def select_skills(skills: Sequence[SkillLike], query: str, top_k: int = 3,
                  method: str = "bm25") -> list[SkillLike]:
    """The skills to activate for `query`, best first; only skills whose state is "active".

    - "bm25": the top_k active skills by BM25 over name + description, score > 0 only;
      ties keep library order (deterministic, so two gate arms see the same context).
    - "all": every active skill (top_k ignored); "none": no skill.
    """
    if method not in METHODS:
        raise ValueError(f"unknown skill activation method {method!r}; known: "
                         f"{', '.join(METHODS)}")
    active = [s for s in skills if getattr(s, "state", "active") == "active"]
    if method == "none" or not active or top_k <= 0 and method == "bm25":
        return []
    if method == "all":
        return list(active)
    scores = BM25([f"{s.name} {s.description}" for s in active]).scores(query)
    ranked = sorted(range(len(active)), key=lambda i: (-scores[i], i))
    return [active[i] for i in ranked[:top_k] if scores[i] > 0]
