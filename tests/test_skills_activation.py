"""BM25 skill activation (coevo/agent/skills.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from coevo.agent.skills import BM25, select_skills, skill_query, tokenize


@dataclass
class S:  # the three fields activation reads; the real Skill model has them too
    name: str
    description: str
    state: str = "active"


LIBRARY = [
    S("unit_conversion", "Convert between units of length, mass and temperature."),
    S("geometry_formulas", "Area and perimeter formulas for triangles, circles and polygons."),
    S("date_arithmetic", "Add days to dates, compute weekdays and durations between dates."),
    S("json_tool_calls", "Write tool calls as one JSON object with name and arguments."),
]


def test_bm25_picks_the_relevant_skill():
    picked = select_skills(LIBRARY, "What is the area of a triangle with base 10?", top_k=1)
    assert [s.name for s in picked] == ["geometry_formulas"]
    picked = select_skills(LIBRARY, "convert 5 miles to km (length units)", top_k=2)
    assert picked[0].name == "unit_conversion"


def test_irrelevant_skills_are_not_activated_to_fill_top_k():
    picked = select_skills(LIBRARY, "triangle area", top_k=3)
    assert [s.name for s in picked] == ["geometry_formulas"]
    assert select_skills(LIBRARY, "zebra xylophone", top_k=3) == []


def test_only_active_skills_and_methods():
    lib = [S("geometry_formulas", "triangle area", state="hidden"),
           S("geo2", "triangle area circles")]
    assert [s.name for s in select_skills(lib, "triangle area")] == ["geo2"]
    assert [s.name for s in select_skills(LIBRARY, "x", method="all")] == [s.name for s in LIBRARY]
    assert select_skills(LIBRARY, "triangle", method="none") == []
    with pytest.raises(ValueError, match="known: bm25"):
        select_skills(LIBRARY, "x", method="dense")


def test_bm25_idf_and_length_normalisation():
    bm = BM25(["triangle", "triangle triangle area area area circle circle", "circle"])
    s = bm.scores("triangle")
    # a short document matching the term outranks a long one with more noise
    assert s[0] > s[1] > 0 and s[2] == 0
    # a term found in every document still scores positive (Lucene idf, not negative)
    assert all(v > 0 for v in BM25(["a b", "b c", "b d"]).scores("b"))


def test_query_includes_offered_function_names():
    q = skill_query([{"role": "user", "content": "Help me with this."}],
                    [{"name": "calculate_triangle_area", "description": "Area of a triangle."}])
    assert "triangle" in tokenize(q)
    assert select_skills(LIBRARY, q, top_k=1)[0].name == "geometry_formulas"
