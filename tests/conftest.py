"""Shared test fixtures: every test gets its own database and home folder (as simonw/llm does),
so no test reads or writes a user's coevo.db, cache or Ray folders by accident."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The embedded model's dequantized cache is expensive to rebuild (16 s); keep it across tests
# in the real user cache, resolved before HOME is redirected.
_REAL_CACHE = os.environ.get("COEVO_CACHE_DIR") or str(
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "coevo"
)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("COEVO_DB", f"sqlite:///{tmp_path / 'coevo.db'}")
    monkeypatch.setenv("COEVO_HOME", str(tmp_path / "coevo-home"))
    monkeypatch.setenv("COEVO_CACHE_DIR", _REAL_CACHE)
    yield tmp_path


def _pg_url() -> str | None:
    return os.environ.get("COEVO_TEST_PG_URL")


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    """A fresh database URL: a SQLite file, and a fresh PostgreSQL database when
    COEVO_TEST_PG_URL points at a server (.ci/run starts one). In CI a missing server is an
    error, not a skip, so the PostgreSQL half cannot silently stop running."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    base = _pg_url()
    if not base:
        if os.environ.get("CI"):
            pytest.fail("CI must set COEVO_TEST_PG_URL (see .ci/postgres.sh)")
        pytest.skip("no PostgreSQL server (set COEVO_TEST_PG_URL)")
    import uuid

    import sqlalchemy as sa

    name = "t_" + uuid.uuid4().hex[:12]
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = base.rsplit("/", 1)[0] + "/" + name
    yield url
    with admin.connect() as c:
        c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def bwrap():
    """The `bwrap` sandbox, usable here. A machine without it skips the test; CI installs it
    (.ci/run), so there its absence is an error, not a skip."""
    from coevo.sandbox import SANDBOXES

    sandbox = SANDBOXES.get("bwrap")
    problem = sandbox.problem()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide bubblewrap (.ci/run installs it): {problem}")
        pytest.skip(problem)
    return sandbox


@pytest.fixture(scope="session")
def review_store(tmp_path_factory):
    """(SQLite URL, proposal ids by name) of the reviewer app's test store: real scripted runs
    (tests/serve_glue.py), built once for test_serve.py and test_serve_browser.py."""
    import serve_glue

    return serve_glue.build_store(tmp_path_factory.mktemp("review") / "review.db")
