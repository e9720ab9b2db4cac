"""`coevo serve --review` without a browser (coevo/serve/review.py): the approve / veto form of a
candidate held for review, its one POST endpoint and every check on it (cross-site, the form
secret, the token), the stored review row, escaping of the reviewer's note, and no write
route at all without --review."""

from __future__ import annotations

import re
import shutil

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

import serve_glue
from coevo.errors import CoevoError
from coevo.serve.app import create_app
from coevo.serve.review import ReviewSettings, review_settings
from coevo.store import Store
from coevo.store.queries import open_readonly
from test_serve import cells, text


@pytest.fixture(scope="module")
def held(tmp_path_factory):
    return serve_glue.build_held_store(tmp_path_factory.mktemp("held") / "held.db")


@pytest.fixture
def url(held, tmp_path):
    """A private copy of the held store (each test writes its own reviews)."""
    shutil.copy(held[0].removeprefix("sqlite:///"), tmp_path / "h.db")
    return f"sqlite:///{tmp_path / 'h.db'}"


def _client(url: str, settings: ReviewSettings | None):
    store = open_readonly(url, readonly=settings is None)
    return store, TestClient(create_app(store, review=settings), follow_redirects=False)


def _form(page: str) -> dict[str, str]:
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', page))


def test_without_review_there_is_no_form_and_no_write_route(url, held):
    pid = held[1]["tool"]
    store, client = _client(url, None)
    page = client.get(f"/proposals/{pid}").text
    assert "Awaiting human review." in text(page) and "<form class=\"review\"" not in page
    assert f"coevo proposals approve|veto {pid[:12]} --by NAME" in text(page)
    r = client.post(f"/proposals/{pid}/review", data={"decision": "approve", "by": "eve"})
    assert r.status_code == 404  # no such route, not a refused write
    assert store.reviews() == [] and store.get_proposal(pid).status == "pending"
    store.close()


def test_approve_from_the_page_stores_the_review(url, held):
    pid, style = held[1]["tool"], held[1]["style"]
    store, client = _client(url, ReviewSettings())
    page = client.get(f"/proposals/{pid}").text
    assert '<form class="review" method="post"' in page and "review" in text(page)[:200]
    hidden = _form(page)
    assert set(hidden) == {"csrf"}  # on loopback without a token none is asked
    assert 'name="token"' not in page
    assert '<form class="review"' not in client.get(f"/proposals/{style}").text  # rejected
    note = "<script>document.title='pwned'</script> fine"
    r = client.post(f"/proposals/{pid}/review", data={**hidden, "decision": "approve",
                                                     "by": "alice", "note": note})
    assert (r.status_code, r.headers["location"]) == (303, f"/proposals/{pid}#review")
    [rv] = store.reviews(proposal=pid)
    assert (rv.by, rv.decision, rv.note) == ("alice", "approve", note)
    assert store.get_proposal(pid).status == "pending"  # the run applies it, not the app
    page = client.get(f"/proposals/{pid}").text
    assert "<script>" not in page and "&lt;script&gt;document.title=" in page
    assert "alice approve <script>document.title='pwned'</script> fine" in text(page)
    assert "The run applies it at its next round start." in text(page)
    assert '<form class="review"' not in page
    r = client.post(f"/proposals/{pid}/review", data={**hidden, "decision": "veto", "by": "bob"})
    assert r.status_code == 400 and "already reviewed: approve by alice" in text(r.text)
    r = client.post(f"/proposals/{style}/review", data={**hidden, "decision": "veto", "by": "b"})
    assert r.status_code == 400 and "is rejected, not pending review" in text(r.text)
    assert len(store.reviews()) == 1
    store.close()


def test_cross_site_and_forged_writes_are_refused(url, held):
    pid = held[1]["tool"]
    store, client = _client(url, ReviewSettings())
    ok = {**_form(client.get(f"/proposals/{pid}").text), "decision": "veto", "by": "mallory"}
    for data, headers, why in (
            ({**ok, "csrf": "guessed"}, {}, "the form is not this server's"),
            ({k: v for k, v in ok.items() if k != "csrf"}, {}, "the form is not this server's"),
            (ok, {"origin": "http://evil.example"}, "a form from http://evil.example cannot write"),
            (ok, {"origin": "null"}, "a form from null cannot write"),
            (ok, {"sec-fetch-site": "cross-site"}, "a cross-site request cannot write")):
        r = client.post(f"/proposals/{pid}/review", data=data, headers=headers)
        assert r.status_code == 403 and why in text(r.text), (why, r.text)
    r = client.post(f"/proposals/{pid}/review", content=b'{"decision": "veto"}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 403 and "expected a form post" in text(r.text)
    r = client.post(f"/proposals/{pid}/review", data={**ok, "note": "x" * 70_000})
    assert r.status_code == 403 and "the form is over 64 KiB" in text(r.text)
    assert store.reviews() == []
    r = client.post(f"/proposals/{pid}/review", data=ok,
                    headers={"origin": "http://testserver", "sec-fetch-site": "same-origin"})
    assert r.status_code == 303 and [x.by for x in store.reviews()] == ["mallory"]
    store.close()


def test_a_token_is_checked_on_every_write(url, held, monkeypatch):
    pid = held[1]["tool"]
    store, client = _client(url, ReviewSettings(token="s3cret-token"))
    page = client.get(f"/proposals/{pid}").text
    assert 'type="password" name="token"' in page and "s3cret-token" not in page
    ok = {**_form(page), "decision": "approve", "by": "alice"}
    for token in (None, "", "s3cret", "s3cret-token "):
        data = ok if token is None else {**ok, "token": token}
        r = client.post(f"/proposals/{pid}/review", data=data)
        assert r.status_code == 403 and "wrong or missing review token" in text(r.text)
    assert store.reviews() == []
    r = client.post(f"/proposals/{pid}/review", data={**ok, "token": "s3cret-token"})
    assert r.status_code == 303 and [x.by for x in store.reviews()] == ["alice"]
    store.close()
    # Off loopback --review needs a token: from --token or the environment.
    monkeypatch.delenv("COEVO_SERVE_TOKEN", raising=False)
    with pytest.raises(CoevoError, match="not loopback.*needs a token"):
        review_settings("0.0.0.0", None, loopback=False)
    assert review_settings("0.0.0.0", "t1", loopback=False).token == "t1"
    assert review_settings("127.0.0.1", None, loopback=True).token is None
    monkeypatch.setenv("COEVO_SERVE_TOKEN", "from-env")
    assert review_settings("10.0.0.5", None, loopback=False).token == "from-env"
    monkeypatch.delenv("COEVO_SERVE_TOKEN")
    from coevo.cli import app

    r = CliRunner().invoke(app, ["serve", "--review", "--host", "0.0.0.0", "--db", url])
    assert r.exit_code == 1 and "needs a token" in r.output


def test_the_loop_applies_a_review_given_in_the_app(url, held):
    """The app's review is what the loop reads: resumed, the run applies it at round 1."""
    pid = held[1]["tool"]
    store, client = _client(url, ReviewSettings())
    r = client.post(f"/proposals/{pid}/review", data={**_form(client.get(
        f"/proposals/{pid}").text), "decision": "approve", "by": "alice"})
    assert r.status_code == 303
    store.close()
    store = Store.open(url)
    seed = store.get_run("review-held").config["seed"]["harness"]
    serve_glue.resume_run(store, serve_glue.config(
        "review-held", [serve_glue.TOOL, serve_glue.STYLE], 2, seed, human_review=True))
    assert store.get_proposal(pid).status == "accepted"
    assert store.get_round("review-held", 1).summary["incumbent"]["harness"] == \
        store.get_proposal(pid).candidate
    app = TestClient(create_app(store))
    page = app.get(f"/proposals/{pid}").text
    assert "Accepted by human review: approved by review" in text(page)
    # The round's table: the review's verdict, the gate's numbers (mean diff +0.500 on 12 tasks).
    [row] = [r for r in cells(app.get(f"/runs/{store.get_run('review-held').id}/rounds/0").text,
                              "row-accepted")]
    assert row[0] == pid[:12] and row[5] == "+0.500"
    assert "approved by review" in " ".join(row)
    store.close()
