"""Skill activation: which skills of the library enter a task's context.

Agent Skills are meant to be loaded by relevance, from their `name` and `description` only
(the body is what gets loaded). Relevance here is Okapi BM25 (Robertson & Zaragoza 2009) with
the usual k1 = 1.5, b = 0.75 and the Lucene-style idf `log(1 + (N - df + 0.5) / (df + 0.5))`,
which stays positive for terms found in most documents (the original idf goes negative there,
which would make a small library rank a skill *down* for matching the query).

Departures: documents are tiny (a name and one sentence), so the tokenizer splits snake_case
and camelCase identifiers into words (a skill named `unit_conversion` matches "convert units"
only through "unit"; no stemming beyond a plural "s"), and a skill must match at least one
query term to be activated: BM25 top-k alone would fill the k slots with irrelevant skills.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

_WORD = re.compile(r"[A-Za-z][a-z]*|[A-Z]+(?![a-z])|\d+")
_STOP = frozenset(
    "a an and are as at be by for from has have how i in is it its of on or that the this to "
    "use used using was what when which with you your".split())

METHODS = ("bm25", "all", "none")


class SkillLike(Protocol):
    name: str
    description: str
    state: str


def tokenize(text: str) -> list[str]:
    """Lower-case words, identifiers split, stop words dropped, a plural "s" trimmed.

    >>> tokenize("getWeatherForecast for unit_conversions")
    ['get', 'weather', 'forecast', 'unit', 'conversion']
    """
    out = []
    for word in _WORD.findall(text):
        w = word.lower()
        if w in _STOP:
            continue
        if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
            w = w[:-1]
        out.append(w)
    return out


class BM25:
    """Okapi BM25 over a fixed list of documents.

    >>> bm = BM25(["compute the area of a triangle", "convert temperature units"])
    >>> [round(s, 3) for s in bm.scores("triangle area")]
    [1.386, 0.0]
    """

    def __init__(self, documents: Sequence[str], k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = k1, b
        self.docs = [Counter(tokenize(d)) for d in documents]
        self.lengths = [sum(d.values()) for d in self.docs]
        self.avg_len = (sum(self.lengths) / len(self.docs)) if self.docs else 0.0
        df: Counter[str] = Counter()
        for d in self.docs:
            df.update(d.keys())
        n = len(self.docs)
        self.idf = {t: math.log(1.0 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: str) -> list[float]:
        terms = tokenize(query)
        out = []
        for doc, length in zip(self.docs, self.lengths):
            norm = self.k1 * (1 - self.b + self.b * length / self.avg_len) if self.avg_len else 0
            s = 0.0
            for t in terms:  # a repeated query term counts again, as in Lucene
                tf = doc.get(t, 0)
                if tf:
                    s += self.idf[t] * tf * (self.k1 + 1) / (tf + norm)
            out.append(s)
        return out


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
