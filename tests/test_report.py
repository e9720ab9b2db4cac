"""The HTML report: one self-contained file (no URLs loaded), plots as inline SVG, and the
run's real numbers and reasons in it; missing data shows as "no data"."""

from __future__ import annotations

import re

import pytest
from test_audit import ACCEPT_REASON, INVALID_ERROR, REJECT_REASON, populate

from coevo.audit import proposal_rows
from coevo.errors import CoevoError, NotFound
from coevo.report import acceptance_by_proposer, render_report, write_report
from coevo.store import Store

# Anything that would make a browser fetch: src=/href= to http(s) or protocol-relative URLs,
# CSS url(http...), @import.
EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?\s*(?:https?:)?//|@import""",
                      re.I)


@pytest.fixture
def store(tmp_path):
    s = Store.open(f"sqlite:///{tmp_path / 'report.db'}")
    yield s
    s.close()


def test_external_pattern_can_fail():
    assert EXTERNAL.search('<script src="https://cdn.example/x.js">')
    assert EXTERNAL.search("<link href='//fonts.example/css'>")
    assert not EXTERNAL.search('<svg xmlns="http://www.w3.org/2000/svg">')


def test_report_is_self_contained_with_plots_and_numbers(store, tmp_path):
    world = populate(store)
    out = write_report(store, "exp1", tmp_path / "out" / "report.html")
    assert out.exists()
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "<style>" in text
    assert not EXTERNAL.search(text)
    assert "<!DOCTYPE svg" not in text and "<metadata>" not in text
    # four plots, all drawn (no "no data" placeholders)
    assert text.count("<svg") == 4 and "no data" not in text
    # plot text is kept as text (svg.fonttype none), so titles are searchable
    for title in ("validation score per round", "RL reward per step",
                  "acceptance by proposer"):
        assert title in text
    # rounds: val from the summary and from the evaluation, test score, budgets
    assert "0.500" in text and "0.667" in text and "0.450" in text
    assert re.search(r"<td>rollouts</td><td class=\"num\">160</td><td class=\"num\">200</td>"
                     r"<td class=\"num\">80%</td>", text)
    # proposals with their statuses and reasons (HTML-escaped where needed)
    for status in ("accepted", "rejected", "invalid", "pending"):
        assert f'<span class="{status}">{status}</span>' in text
    assert ACCEPT_REASON.replace(">", "&gt;") in text
    assert REJECT_REASON.replace(">", "&gt;") in text and INVALID_ERROR in text
    assert world.acc[:12] in text and world.h[1].hash[:12] in text
    # acceptance by proposer: harness_lm 1 accepted, 1 invalid -> 100% of decided
    row = re.search(r"<tr><td>harness_lm</td>(.*?)</tr>", text).group(1)
    assert re.findall(r">([^<]+)</td>", row) == ["1", "0", "1", "0", "100%"]


def test_acceptance_by_proposer_counts(store):
    populate(store)
    assert acceptance_by_proposer(proposal_rows(store, run="exp1")) == {
        "demos": {"accepted": 0, "rejected": 1, "invalid": 0, "pending": 0},
        "harness_lm": {"accepted": 1, "rejected": 0, "invalid": 1, "pending": 0},
        "skills_lm": {"accepted": 0, "rejected": 0, "invalid": 0, "pending": 1},
    }


def test_missing_data_degrades_to_no_data(store, tmp_path):
    run = store.create_run("bare")
    store.start_round(run.id, 0)
    store.finish_round(run.id, 0, summary={})
    text = render_report(store, "bare")
    assert "<svg" not in text
    assert text.count("no data") == 4
    # each note names the key to write (quotes HTML-escaped)
    assert "summary[&quot;val_score&quot;]" in text and "summary[&quot;rl_steps&quot;]" in text
    assert not EXTERNAL.search(text)


def test_reward_plot_from_trajectories_when_no_summary_steps(store):
    from coevo.trajectory import Trajectory

    run = store.create_run("traj")
    store.start_round(run.id, 0)
    store.add_trajectories([Trajectory(env="toy", task_id="t", reward=0.5)], run=run.id, round=0)
    text = render_report(store, "traj")
    assert text.count("<svg") == 1 and "RL reward per step" in text  # only the reward plot


def test_html_in_stored_text_is_escaped(store):
    run = store.create_run("esc")
    store.add_proposal(proposer="<script>alert(1)</script>", kind="harness", parent=None,
                       candidate=None, run=run.id, status="invalid", error="bad <b>yaml</b>")
    text = render_report(store, "esc")
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert "bad &lt;b&gt;yaml&lt;/b&gt;" in text


def test_errors_name_the_problem(store, tmp_path):
    with pytest.raises(NotFound, match="no run"):
        write_report(store, "nope", tmp_path / "r.html")
    store.create_run("r")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CoevoError, match="cannot write the report"):
        write_report(store, "r", blocker / "r.html")


def test_human_reviews_are_listed_and_the_gate_numbers_kept(store):
    world = populate(store)
    assert "Human reviews" not in render_report(store, "exp1")  # none yet: no section
    # The pending proposal passes the gate, is held, approved with a note, and applied.
    store.add_decision(world.pend, policy="paired", accepted=True, reason="clears the gate",
                       statistic={"mean_diff": 0.25, "p_value": 0.01}, rollouts=8,
                       status="pending")
    rid = store.add_review(world.pend, decision="approve", by="dana <d@x>", note="ok <b>go</b>")
    store.add_decision(world.pend, policy="review", accepted=True,
                       reason=f"approved by review {rid[:12]} by dana",
                       statistic={"review": rid})
    text = render_report(store, "exp1")
    section = text[text.index("<h2>Human reviews</h2>"):]
    row = re.search(r"<tbody><tr>(.*?)</tr>", section).group(1)
    assert re.findall(r"<td>(.*?)</td>", row)[2:] == ["dana &lt;d@x&gt;", "approve",
                                                      "ok &lt;b&gt;go&lt;/b&gt;"]
    assert world.pend[:12] in row
    [pend] = [r for r in proposal_rows(store, run="exp1") if r.id == world.pend]
    assert (pend.status, pend.reason) == ("accepted", f"approved by review {rid[:12]} by dana")
    assert (pend.mean_diff, pend.p_value, pend.rollouts) == (0.25, 0.01, 8)  # the gate's
