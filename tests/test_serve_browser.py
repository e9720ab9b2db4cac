"""The reviewer web app in a real browser: `coevo serve` (the CLI, as a user starts it) on the
scripted runs of tests/serve_glue.py, driven by Playwright through Debian's chromium.

A reviewer opens the run, clicks to the rejected proposal, reads the diff and the per-task
evidence, filters the tasks it lost and opens both episodes of one; follows the final
harness to its blame and lineage; compares two runs. With `coevo serve --review` a reviewer
approves a candidate the run holds for review by clicking, and the resumed run applies it.
Model-written HTML (and a reviewer's note) stays text in the browser, and the content
security policy is never violated (no console error).

Screenshots of these pages are taken on every run; with COEVO_UPDATE_SCREENSHOTS=1 they are
written to docs/ (what the README shows), otherwise to a temporary folder.

Needs `chromium` (Debian package) and the `playwright` package (the dev extra); `.ci/run`
installs both, so in CI their absence is an error, not a skip. No browser is downloaded:
Playwright launches the system chromium by path.
"""

from __future__ import annotations

import os
import re
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import serve_glue

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("COEVO_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        return f"no chromium at {CHROMIUM} (apt-get install chromium)"
    return None


def _serve(db: str, *extra: str):
    """Start `coevo serve --port 0` (the CLI, as a user starts it) on `db`; returns the
    process, the URL it printed and its first lines. Skips (fails in CI) without the tools."""
    problem = _missing()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide the browser test's tools (.ci/run installs them): {problem}")
        pytest.skip(problem)
    proc = subprocess.Popen([sys.executable, "-m", "coevo.cli", "serve", "--db", db,
                             "--port", "0", *extra], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()  # read in a thread: readline() would block
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    seen, url, deadline = [], None, time.monotonic() + 120
    while url is None and time.monotonic() < deadline and proc.poll() is None:
        try:
            seen.append(lines.get(timeout=1.0))
        except queue.Empty:
            continue
        m = re.search(r"open (http://127\.0\.0\.1:\d+/)", seen[-1])
        url = m.group(1) if m else None
    if not url:
        proc.terminate()
        proc.wait(timeout=30)
        pytest.fail(f"coevo serve printed no URL: {''.join(seen)}")
    return proc, url, "".join(seen)


@pytest.fixture(scope="module")
def server(review_store):
    """`coevo serve --port 0` on the test store; yields the URL it printed."""
    proc, url, seen = _serve(review_store[0])
    try:
        assert "(read-only)" in seen
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def browser(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A fresh page; fails the test on any console error (a CSP violation logs one)."""
    ctx = browser.new_context(viewport={"width": 1360, "height": 900})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    ctx.close()
    assert errors == []


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    if os.environ.get("COEVO_UPDATE_SCREENSHOTS"):
        return REPO / "docs"
    return tmp_path_factory.mktemp("screenshots")


def snap(page, shots: Path, name: str) -> None:
    path = shots / f"serve-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000  # a rendered page, not a blank one


def test_open_a_run_a_rejected_proposal_its_lost_tasks_and_both_episodes(page, server, review_store, shots):
    ids = review_store[1]
    page.goto(server)
    assert page.locator("h1").inner_text() == "Runs"
    snap(page, shots, "runs")
    page.get_by_role("link", name="review-demo", exact=True).click()
    assert page.locator("h1").inner_text() == "Run review-demo"
    assert page.locator("svg.chart circle").count() == 4  # seed + 3 rounds
    snap(page, shots, "run")

    rejected = page.locator("tr.row-rejected", has_text="shorter replies")
    rejected.get_by_role("link", name=ids["terse"][:12]).click()
    assert page.url.endswith(f"/proposals/{ids['terse']}")
    assert page.locator("p.verdict").inner_text().startswith("Rejected by the gate (paired)")
    assert page.locator("table.diff tr.d-insert td.r").all_inner_texts() == [serve_glue.TERSE_LINE]
    assert page.locator("table.diff tr.d-equal td.l").all_inner_texts() == [
        serve_glue.SEED_PROMPT, serve_glue.TOOL_LINE]
    assert page.locator("tr.ev-lost").count() == 4 and page.locator("tr.ev-won").count() == 2
    snap(page, shots, "proposal")

    page.get_by_role("link", name="lost (4)").click()
    tasks = page.locator("table.evidence tbody td.task").all_inner_texts()
    assert sorted(tasks) == sorted(serve_glue.TERSE_LOSSES)
    assert page.locator("table.evidence tbody tr").count() == page.locator("tr.ev-lost").count() == 4

    val1 = page.locator("tr.ev-lost").filter(has=page.locator("td.task", has_text=re.compile(r"^val-1$")))
    val1.get_by_role("link", name="open both").click()
    assert page.locator("h1").inner_text() == "Task val-1, sample 0: candidate lost"
    inc, cand = page.locator("section.arm-incumbent"), page.locator("section.arm-candidate")
    assert "The code word is code-1." in inc.inner_text()
    assert "The code word is unknown." in cand.inner_text()
    for arm in (inc, cand):
        assert arm.locator("p.call").inner_text() == 'call lookup {"key": "1"}'
        assert arm.locator("div.observation pre").inner_text() == "code-1"
        assert "criterion called" in arm.locator("table.reward").inner_text()
    assert "1.000" in inc.locator("table.reward tr", has_text="outcome").inner_text()
    assert "0.000" in cand.locator("table.reward tr", has_text="outcome").inner_text()
    snap(page, shots, "pair")


def test_model_written_html_stays_text_in_the_browser(page, server, review_store):
    page.goto(f"{server}proposals/{review_store[1]['style']}")
    assert page.evaluate("document.title").startswith("Proposal ")  # the <script> never ran
    assert page.locator("img[src=x]").count() == 0
    assert serve_glue.XSS in page.locator("section", has_text="Rationale").locator("pre").inner_text()


def test_follow_the_final_harness_to_its_blame_and_lineage(page, server, review_store, shots):
    ids = review_store[1]
    page.goto(server)
    page.get_by_role("link", name="review-demo", exact=True).click()
    page.locator("table tr", has_text="harness").filter(has_text="lineage") \
        .get_by_role("link", name="blame").first.click()
    rows = page.locator("#field-system_prompt tr")
    assert rows.locator("td.code").all_inner_texts() == [
        serve_glue.SEED_PROMPT, serve_glue.TOOL_LINE, serve_glue.WORD_LINE]
    origins = rows.locator("td.origin").all_inner_texts()
    assert origins[0].startswith("seed")
    assert origins[1].startswith(ids["tool"][:8]) and "round 0" in origins[1]
    assert origins[2].startswith(ids["word"][:8]) and "round 2" in origins[2] and "+0.500" in origins[2]
    snap(page, shots, "blame")
    rows.nth(1).locator("td.origin a").first.click()  # the line's proposal
    assert page.url.endswith(f"/proposals/{ids['tool']}")
    page.go_back()
    page.get_by_role("link", name="Lineage of this version").click()
    assert page.locator("ul.tree li.node").count() == 6
    assert page.locator("ul.tree li.node-rejected").count() == 2
    snap(page, shots, "lineage")


def test_compare_two_ticked_runs(page, server, shots):
    page.goto(server)
    for box in page.locator("input[type=checkbox][name=run]").all():
        box.check()
    page.get_by_role("button", name="Compare the ticked runs").click()
    assert page.locator("h1").inner_text() == "Compare 2 runs"
    assert page.locator("svg.chart circle").count() == 4 + 3
    snap(page, shots, "compare")


def _off_loop(fn, *args):
    """fn(*args) in another thread: Playwright's sync API keeps an event loop running in this
    one, where the loop's synchronous episode runner refuses to start."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


def test_approve_a_held_candidate_with_review(page, tmp_path, shots):
    """`coevo serve --review`: approve the candidate the run holds by clicking; the review row
    is stored (its note, model-free but typed by a person, still shown as text); resumed, the
    run applies it and the page shows the review's decision."""
    from coevo.store import Store

    url, ids = _off_loop(serve_glue.build_held_store, tmp_path / "held.db")
    proc, server, seen = _serve(url, "--review")
    note = "<script>document.title='pwned'</script> checked the evidence"
    try:
        assert "(review: approve / veto enabled)" in seen
        page.goto(f"{server}proposals/{ids['tool']}")
        assert page.locator("p.verdict").inner_text().startswith("Awaiting human review.")
        page.get_by_label("your name").fill("alice")
        page.get_by_label("note").fill(note)
        snap(page, shots, "review")
        page.get_by_role("button", name="Approve").click()
        page.wait_for_url(f"**/proposals/{ids['tool']}#review")
        row = page.locator("table.reviews tr.review-row")
        assert row.count() == 1 and row.locator("td").nth(1).inner_text() == "alice"
        assert row.locator("td").nth(2).inner_text() == "approve"
        assert row.locator("td.note").inner_text() == note
        assert page.evaluate("document.title").startswith("Proposal ")  # the note never ran
        assert page.locator("form.review").count() == 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    store = Store.open(url)
    [rv] = store.reviews(proposal=ids["tool"])
    assert (rv.by, rv.decision, rv.note) == ("alice", "approve", note)
    seed = store.get_run("review-held").config["seed"]["harness"]
    _off_loop(serve_glue.resume_run, store, serve_glue.config(
        "review-held", [serve_glue.TOOL, serve_glue.STYLE], 2, seed, human_review=True))
    [gate, review] = store.decisions(ids["tool"])
    assert gate.accepted and (review.policy, review.accepted) == ("review", True)
    assert review.statistic["review"] == rv.id and store.get_proposal(ids["tool"]).status == "accepted"
    store.close()
    proc, server, _ = _serve(url)
    try:
        page.goto(f"{server}proposals/{ids['tool']}")
        assert page.locator("p.verdict").inner_text().startswith(
            "Accepted by human review: approved by review")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
