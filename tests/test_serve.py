"""The reviewer web app (coevo/serve/) without a browser: the blame algorithm, the read-only
store, and every page rendered by the real app over real stores (the scripted runs of
tests/serve_glue.py, and bench/serve.py's synthetic store for paging), read back as text.
"""

from __future__ import annotations

import hashlib
import html
import importlib.util
import re
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

import serve_glue
from coevo.assets.harness import Harness
from coevo.errors import CoevoError
from coevo.serve.app import allowed_hosts, create_app
from coevo.serve.blame import Origin, blame_texts, blame_version
from coevo.serve.versions import tree_rows
from coevo.store import Store
from coevo.store.queries import evidence_episodes, open_readonly

REPO = Path(__file__).resolve().parent.parent


def text(page: str) -> str:
    """The page's visible text, tags dropped, entities decoded, whitespace collapsed."""
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page))).strip()


def cells(page: str, row_class: str) -> list[list[str]]:
    """The text of each cell of every <tr> whose class list holds `row_class`."""
    out = []
    for row in re.findall(rf'<tr class="[^"]*\b{re.escape(row_class)}\b[^"]*">(.*?)</tr>', page, re.S):
        out.append([text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)])
    return out


@pytest.fixture(scope="module")
def client(review_store):
    url, _ = review_store
    store = open_readonly(url)
    yield TestClient(create_app(store))
    store.close()


@pytest.fixture(scope="module")
def ids(review_store):
    return review_store[1]


@pytest.fixture(scope="module")
def store(review_store):
    s = open_readonly(review_store[0])
    yield s
    s.close()


def get(client, path: str, status: int = 200) -> str:
    r = client.get(path)
    assert r.status_code == status, (path, r.status_code, text(r.text)[:500])
    assert "Traceback" not in r.text
    return r.text


# --- blame ---------------------------------------------------------------------------------------


def test_blame_texts_keeps_each_lines_author_through_edits():
    seed, a, b = Origin("s", seed=True), Origin("a"), Origin("b")
    out = blame_texts([
        (seed, {"p": "one\ntwo\nthree\n", "gone": "x\n"}),
        (a, {"p": "one\nTWO\nthree\nfour\n", "new": "n\n"}),   # replace line 2, append line 4
        (b, {"p": "TWO\nthree\nzero\nfour\n", "new": "n\n"}),  # drop line 1, insert before 4
    ])
    assert [(x.number, x.text, x.origin.version) for x in out["p"]] == [
        (1, "TWO", "a"), (2, "three", "s"), (3, "zero", "b"), (4, "four", "a")]
    assert [(x.text, x.origin.version) for x in out["new"]] == [("n", "a")]
    assert "gone" not in out  # a field the last version lacks is not blamed


def _decide(store, pid, accepted, mean_diff):
    store.add_decision(pid, policy="paired", accepted=accepted, reason="r", rollouts=4,
                       statistic={"mean_diff": mean_diff},
                       evidence=[{"task_id": "t", "incumbent": 0.0, "candidate": 1.0}])


def test_blame_of_a_three_round_lineage_walks_the_store(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'b.db'}")
    run = store.create_run("r")
    seed = Harness.model_validate({"name": "h", "system_prompt": "Be brief.\nUse tools."})
    store.put_asset(seed)
    versions, pids = [seed], []
    prompts = ["Be brief.\nUse tools.\nCheck units.",           # round 0: append a line
               "Be very brief.\nUse tools.\nCheck units.",      # round 1: rewrite line 1
               "Be very brief.\nCheck units.\nShow work."]      # round 2: drop 2, add 3
    for r, prompt in enumerate(prompts):
        store.start_round(run.id, r)
        cand = versions[-1].child(system_prompt=prompt)
        pids.append(store.add_proposal(proposer=f"p{r}", kind="harness", parent=versions[-1].hash,
                                       candidate=cand, run=run.id, round=r))
        _decide(store, pids[-1], True, 0.1 * (r + 1))
        # a rejected sibling of each round must not change who wrote the accepted lines
        bad = versions[-1].child(system_prompt=prompt + f"\nnoise {r}")
        _decide(store, store.add_proposal(proposer="x", kind="harness", parent=versions[-1].hash,
                                          candidate=bad, run=run.id, round=r), False, -0.1)
        versions.append(cand)
    chain, fields = blame_version(store, versions[-1].hash)
    assert chain == [v.hash for v in versions]
    got = [(x.text, x.origin.seed, x.origin.proposal and x.origin.proposal.id,
            x.origin.proposal and x.origin.proposal.round, x.origin.delta) for x in fields["system_prompt"]]
    assert got == [("Be very brief.", False, pids[1], 1, pytest.approx(0.2)),
                   ("Check units.", False, pids[0], 0, pytest.approx(0.1)),
                   ("Show work.", False, pids[2], 2, pytest.approx(0.3))]
    assert all(x.origin.seed and x.origin.version == seed.hash for x in fields["name"])
    # The rejected sibling's own blame credits its new line to its rejected proposal.
    bad = store.proposals(status="rejected", round=2)[0]
    _, bad_fields = blame_version(store, bad.candidate)
    last = bad_fields["system_prompt"][-1]
    assert (last.text, last.origin.proposal.status, last.origin.delta) == ("noise 2", "rejected", -0.1)


def test_blame_page_of_the_runs_final_harness(client, store, ids):
    final = store.get_proposal(ids["word"]).candidate
    page = get(client, f"/versions/{final}/blame")
    rows = re.search(r'<table class="blame" id="field-system_prompt">(.*?)</table>', page, re.S).group(1)
    lines = [(text(o), text(c)) for o, c in re.findall(
        r'<td class="origin">(.*?)</td>\s*<td class="ln">\d+</td>\s*<td class="code">(.*?)</td>', rows, re.S)]
    assert [c for _, c in lines] == [serve_glue.SEED_PROMPT, serve_glue.TOOL_LINE, serve_glue.WORD_LINE]
    assert lines[0][0].startswith("seed")
    assert lines[1][0].startswith(ids["tool"][:8]) and "round 0" in lines[1][0] and "accepted +0.500" in lines[1][0]
    assert lines[2][0].startswith(ids["word"][:8]) and "round 2" in lines[2][0]
    assert f'href="/proposals/{ids["tool"]}"' in rows


# --- the read-only store -------------------------------------------------------------------------


def test_readonly_store_refuses_writes_and_pages_change_nothing(review_store, client, ids, tmp_path):
    url, _ = review_store
    path = Path(url.removeprefix("sqlite:///"))
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    store = open_readonly(url)
    with pytest.raises(Exception, match="readonly|read-only|attempt to write"):
        store.add_budget(store.runs()[0].id, "rollouts", 1.0)
    store.close()
    for p in ("/", f"/proposals/{ids['terse']}", f"/proposals/{ids['terse']}/pair?task=val-1",
              "/proposals?q=code", "/assets"):
        get(client, p)
    for method in ("post", "put", "delete", "patch"):
        r = getattr(client, method)(f"/proposals/{ids['terse']}")
        assert r.status_code == 405 and "only reads" in text(r.text)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    missing = tmp_path / "nothing.db"
    with pytest.raises(CoevoError, match="no store at"):
        open_readonly(str(missing))
    assert not missing.exists()  # opening to read creates nothing


def test_readonly_open_refuses_a_store_without_the_schema(db_url):
    blank = Store.open(db_url, migrate=False)
    assert blank.current_revision() is None  # connecting creates the SQLite file, no tables
    blank.close()
    with pytest.raises(CoevoError, match="no coevo schema.*coevo db upgrade"):
        open_readonly(db_url)
    Store.open(db_url).close()
    ro = open_readonly(db_url)
    assert ro.runs() == []
    with pytest.raises(Exception, match="read-only|readonly|attempt to write"):
        ro.create_run("x")
    ro.close()


def test_host_header_must_name_the_loopback_server(review_store):
    store = open_readonly(review_store[0])
    app = create_app(store, allowed_hosts("127.0.0.1"))
    assert TestClient(app, base_url="http://127.0.0.1:8765").get("/").status_code == 200
    assert TestClient(app, base_url="http://localhost:8765").get("/").status_code == 200
    assert TestClient(app, base_url="http://attacker.example").get("/").status_code == 400
    assert allowed_hosts("0.0.0.0") == ["*"]
    store.close()


# --- pages -----------------------------------------------------------------------------------------


def test_runs_page_lists_each_run_with_counts_scores_and_spend(client):
    page = get(client, "/")
    r = client.get("/")
    assert "script-src" not in r.headers["content-security-policy"]  # no script at all
    assert "default-src 'none'" in r.headers["content-security-policy"]
    body = text(page)
    # run, mode, env, status, rounds, accepted, rejected, invalid, pending, val, test
    assert re.search(r"review-demo harness-only test:code-word done 3 2 2 1 0 0 → 1 1 \[1, 1\]", body)
    assert re.search(r"review-short harness-only test:code-word done 2 1 0 0 0 0 → 0\.500", body)
    demo = re.search(r"review-demo .*?\] (\d+) (\d+) (\S+)", body)
    # gate arms: round 0 incumbent + 2 candidates, round 1 incumbent + 1, round 2 the
    # candidate only (round 1 accepted nothing: its incumbent outcomes are reused,
    # coevo/gatestep.py), x 12 tasks; the scripted proposer calls no model, so no proposer
    # call is charged (coevo/ledger.py)
    assert (demo.group(1), demo.group(2), demo.group(3)) == ("78", "72", "-")


def test_run_page_curve_starts_at_the_seed_and_links_every_round(client, store):
    run = store.get_run("review-demo")
    page = get(client, f"/runs/{run.id}")
    points = re.findall(r"<title>review-demo: (\S+(?: \d)?) ([\d.]+)</title>", page)
    assert points == [("seed", "0.000"), ("round 0", "0.500"), ("round 1", "0.500"), ("round 2", "1.000")]
    for r in range(3):
        assert f'href="/runs/{run.id}/rounds/{r}"' in page
    body = text(page)
    assert "rollouts: gate rollouts (both arms) 72" in body and "rollouts: train rollouts (harness-only) 6" in body
    assert "test episodes (not charged) 6" in body
    assert re.search(r"harness [0-9a-f]{12} blame · lineage", body)


def test_compare_page_plots_both_runs_and_requires_two(client, store):
    a, b = store.get_run("review-demo").id, store.get_run("review-short").id
    page = get(client, f"/compare?run={a}&run={b}")
    assert len(re.findall(r"<title>review-demo: ", page)) == 4
    assert len(re.findall(r"<title>review-short: ", page)) == 3
    assert "accepted / rejected / invalid 2 / 2 / 1 1 / 0 / 0" in text(page)
    assert "two or more runs" in text(get(client, f"/compare?run={a}", 400))


def test_round_page_shows_decisions_and_the_incumbent_change(client, store, ids):
    run = store.get_run("review-demo")
    page = get(client, f"/runs/{run.id}/rounds/0")
    body = text(page)
    assert [c[0] for c in cells(page, "row-accepted")] == [ids["tool"][:12]]
    assert sorted(c[0] for c in cells(page, "row-rejected")) == [ids["style"][:12]]
    invalid = cells(page, "row-invalid")
    assert invalid[0][0] == ids["rename"][:12] and "outside the harness whitelist: name" in invalid[0][-1]
    accepted = cells(page, "row-accepted")[0]
    assert accepted[4:10] == ["paired", "+0.500", "0.333", "0.0156", "0.0312", "6 / 0 / 6"]
    tool = store.get_proposal(ids["tool"])
    assert f"harness {tool.parent[:12]} blame · lineage {tool.candidate[:12]} blame · lineage changed" in body
    assert "no RL steps in this round" in body
    assert "404" in text(get(client, f"/runs/{run.id}/rounds/7", 404))


def test_rejected_proposal_page_diff_stages_and_evidence(client, store, ids):
    page = get(client, f"/proposals/{ids['terse']}")
    body = text(page)
    assert "Rejected by the gate (paired): rejected: 95% lower bound" in body
    assert cells(page, "d-insert") == [["", "", "3", serve_glue.TERSE_LINE]]
    assert [c[1] for c in cells(page, "d-equal")] == [serve_glue.SEED_PROMPT, serve_glue.TOOL_LINE]
    assert "screen 12 12 24 2 4 6 0.8906 reject" in body
    assert "The candidate won 2 , lost 4 , tied 6 , missing 0" in body
    lost = cells(get(client, f"/proposals/{ids['terse']}?show=lost"), "ev-lost")
    assert sorted(c[0] for c in lost) == sorted(serve_glue.TERSE_LOSSES)
    assert all(c[2:6] == ["1", "0", "-1.000", "lost"] and c[6] == "2 → 1" for c in lost)
    won = cells(get(client, f"/proposals/{ids['terse']}?show=won"), "ev-won")
    assert sorted(c[0] for c in won) == sorted(serve_glue.TERSE_WINS)
    assert f'href="/proposals/{ids["terse"]}/pair?task=val-1&amp;sample=0"' in page
    assert "raw output (0 characters)" in body and "exact prompt (0 characters)" in body


def test_pair_page_shows_both_arms_messages_tool_calls_and_rewards(client, store, ids):
    page = get(client, f"/proposals/{ids['terse']}/pair?task=val-1&sample=0")
    arms = re.findall(r'<section class="arm arm-(\w+)">(.*?)</section>', page, re.S)
    assert [a for a, _ in arms] == ["incumbent", "candidate"]
    inc, cand = (text(b) for _, b in arms)
    assert "The code word is code-1." in inc and "The code word is unknown." in cand
    for body in (inc, cand):
        assert 'call lookup {"key": "1"}' in body and "observation from lookup code-1" in body
        assert "criterion called 1.000" in body
    assert "outcome (verifier) 1.000 success yes" in inc and "reward 2.000" in inc
    assert "outcome (verifier) 0.000 success no" in cand and "reward 1.000" in cand
    assert serve_glue.TERSE_LINE in cand and serve_glue.TERSE_LINE not in inc  # system prompts
    links = evidence_episodes(store, ids["terse"])[("val-1", 0)]
    assert all(f'href="/trajectories/{e.id}"' in page for e in links)
    traj = get(client, f"/trajectories/{links[0].id}")
    assert "The code word is code-1." in text(traj)


def test_invalid_proposal_shows_error_raw_output_and_recorded_diff(client, ids):
    page = get(client, f"/proposals/{ids['rename']}")
    body = text(page)
    assert "Invalid : changes fields outside the harness whitelist: name" in body
    assert "the diff recorded with the proposal" in body
    assert cells(page, "d-replace") == [["1", "tiny", "1", "renamed"]]
    assert re.search(r"<details open><summary>raw output \(\d+ characters\)", page)


def test_model_written_html_renders_as_text(client, ids):
    page = get(client, f"/proposals/{ids['style']}")
    assert "<script>document.title" not in page and "<img src=x" not in page
    assert "&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;" in page
    assert serve_glue.XSS in text(page)
    assert serve_glue.XSS in text(get(client, "/proposals?q=friendlier"))


def test_search_by_status_proposer_kind_and_text(client, ids):
    def found(query):
        page = get(client, f"/proposals?{query}")
        return {c[0] for c in cells(page, "row-accepted") + cells(page, "row-rejected") + cells(page, "row-invalid")}

    assert found("status=rejected") == {ids["style"][:12], ids["terse"][:12]}
    assert found("q=CODE+WORD") == {ids["word"][:12]}
    assert found("q=whitelist") == {ids["rename"][:12]}          # the error text
    assert found("q=Holm+over+2") == {ids["tool"][:12], ids["style"][:12]}  # decision reasons
    assert found(f"q={ids['terse'][:6]}") == {ids["terse"][:12]}  # an id prefix
    assert len(found("proposer=scripted&kind=harness")) == 6  # 5 + review-short's one
    assert found("proposer=nobody") == set()
    assert "status 'maybe'" in text(get(client, "/proposals?status=maybe", 400))


def test_lineage_page_draws_accepted_line_rejected_branches_and_invalid(client, store, ids):
    final = store.get_proposal(ids["word"]).candidate
    page = get(client, f"/versions/{final}/lineage")
    nodes = re.findall(r'<li class="ind-(\d+) node node-(\w+)[^"]*">(.*?)</li>', page, re.S)
    got = [(int(i), s, text(b).split()[0]) for i, s, b in nodes]
    p = {k: store.get_proposal(v) for k, v in ids.items()}
    assert got == [
        (0, "seed", p["tool"].parent[:12]),
        (1, "invalid", "invalid"),
        (1, "rejected", p["style"].candidate[:12]),
        (0, "accepted", p["tool"].candidate[:12]),
        (1, "rejected", p["terse"].candidate[:12]),
        (0, "accepted", final[:12]),
    ]


def test_tree_rows_draw_a_long_lineage_without_recursion():
    from coevo.serve.versions import Node
    from coevo.store import AssetRecord
    from datetime import datetime, timezone

    def node(i):
        return Node(AssetRecord(hash=f"{i:064x}", kind="harness", name="h", parent=None,
                                created_at=datetime.now(timezone.utc)), [])
    nodes = [node(i) for i in range(5000)]
    for a, b in zip(nodes, nodes[1:]):
        a.children.append(b)
    rows = tree_rows(nodes[0])
    assert len(rows) == 5000 and {indent for indent, _, _ in rows} == {0}


def test_bad_input_gets_a_clear_error_page(client, store, ids):
    run = store.get_run("review-demo").id
    cases = [
        ("/runs/nope", 404, "no run with id or name 'nope'"),
        (f"/runs/{run}/rounds/x", 400, "round: expected a whole number, got 'x'"),
        (f"/runs/{run}/rounds/-1", 400, "round: must be at least 0"),
        ("/proposals/0000", 404, "no proposal '0000'"),
        ("/?page=0", 400, "page: must be at least 1, got 0"),
        ("/?page=2", 404, "page 2 does not exist: there are 1 page(s)"),
        (f"/proposals/{ids['terse']}?show=best", 400, "show 'best': expected all, won"),
        (f"/proposals/{ids['terse']}/pair", 400, "task: give the evidence row's task id"),
        (f"/proposals/{ids['terse']}/pair?task=val-99", 404, "has no evidence for task 'val-99'"),
        (f"/proposals/{ids['terse']}/pair?task=val-1&sample=x", 400, "sample: expected a whole number"),
        ("/versions/abcdef0123/blame", 404, "no asset version matches 'abcdef0123'"),
        ("/versions/zz/lineage", 404, "no asset version matches 'zz'"),
        ("/trajectories/nope", 404, "no trajectory 'nope'"),
        ("/no/such/page", 404, "no page at /no/such/page"),
    ]
    for path, status, message in cases:
        assert message in text(get(client, path, status)), path


def _bench():
    spec = importlib.util.spec_from_file_location("bench_serve", REPO / "bench" / "serve.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_serve"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_pages_paginate_on_the_bench_store(tmp_path):
    bench = _bench()
    ids = bench.build(tmp_path / "b.db", trajectories=1200, proposals=120)
    store = open_readonly(str(tmp_path / "b.db"))
    client = TestClient(create_app(store))
    run = ids["runs"][0]
    first = get(client, f"/runs/{run}")
    assert "page 1 of 2 (60 rows)" in text(first) and 'href="?page=2"' in first
    second = get(client, f"/runs/{run}?page=2")
    ones, twos = (set(re.findall(r'href="/proposals/(\w+)"', p)) for p in (first, second))
    assert len(ones) == 50 and len(twos) == 10 and not ones & twos
    rejected = get(client, "/proposals?status=rejected&page=2")
    assert "page 2 of 2 (96 rows)" in text(rejected)
    assert 'href="?status=rejected&amp;page=1"' in rejected
    # evidence rows link to the arms' episodes (50 tasks, every one stored)
    pid = ids["proposals"][0]
    page = get(client, f"/proposals/{pid}")
    assert len(re.findall(r'class="open-pair"', page)) == 50
    # every page of the bench answers
    rng = __import__("random").Random(0)
    for name, path_of in bench.pages(ids, rng).items():
        get(client, path_of())
    store.close()


def test_every_page_answers_on_both_backends(db_url):
    """The read-only queries on SQLite and PostgreSQL (ILIKE search, grouped counts, CTEs)."""
    bench = _bench()
    ids = bench.build(db_url, trajectories=400, proposals=40)
    store = open_readonly(db_url)
    client = TestClient(create_app(store))
    for name, path_of in bench.pages(ids, __import__("random").Random(0)).items():
        assert "</main>" in get(client, path_of()), name  # rendered to the end
    found = cells(get(client, "/proposals?q=RULE+1.3"), "row-rejected")  # round 1, 4th proposal
    assert sorted(c[1] for c in found) == ["bench-0", "bench-1"] and {c[3] for c in found} == {"gepa (bench-lm)"}
    assert "parse error" in text(get(client, "/proposals?status=invalid&q=PARSE"))
    store.close()


def test_serve_command_errors_are_one_line(review_store, tmp_path):
    import socket

    from typer.testing import CliRunner

    from coevo.cli import app

    runner = CliRunner()
    r = runner.invoke(app, ["serve", "--db", str(tmp_path / "none.db")])
    assert r.exit_code == 1 and "no store at" in r.output and "Traceback" not in r.output
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = runner.invoke(app, ["serve", "--db", review_store[0], "--port", str(port)])
    assert r.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in r.output
