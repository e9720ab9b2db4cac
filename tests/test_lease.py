"""Run leases (coevo/store/lease.py) on SQLite and, with COEVO_TEST_PG_URL, PostgreSQL: one
holder at a time across real processes, the holder named in the refusal, stale leases taken
over, the heartbeat renewing, release on every exit and a failed run keeping its error."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from coevo.errors import CoevoError
from coevo.store import Store
from coevo.store import tables as T

TRY = """
import sys
from coevo.store import Store
store = Store.open(sys.argv[1])
try:
    with store.executing("r"):
        print("GOT")
except Exception as e:
    print("ERR", e)
"""


def _try_from_another_process(url: str) -> str:
    done = subprocess.run([sys.executable, "-c", TRY, url], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def _put_row(store: Store, pid: int, host: str, expires_in: float) -> None:
    now = T.utcnow()
    with store.transaction() as s:
        s.add(T.RunLease(run_id=store.get_run("r").id, token="x" * 32, pid=pid, host=host,
                         started_at=now - timedelta(seconds=5), heartbeat_at=now,
                         expires_at=now + timedelta(seconds=expires_in)))


def test_a_second_process_is_refused_naming_the_holder(db_url):
    store = Store.open(db_url)
    store.create_run("r")
    with store.executing("r"):
        out = _try_from_another_process(db_url)
        assert out.startswith(f"ERR run r is being executed by pid {os.getpid()} on host "
                              f"{socket.gethostname()} since 20"), out
        assert out.endswith(" UTC") and "\n" not in out
        assert store.get_run("r").status == "created"  # the refused process changed nothing
    assert store.lease_holder("r") is None  # released on exit
    assert _try_from_another_process(db_url) == "GOT"
    store.close()


def test_an_error_marks_the_run_failed_and_releases_the_lease(db_url):
    store = Store.open(db_url)
    store.create_run("r", status="running")
    with pytest.raises(ValueError):
        with store.executing("r"):
            raise ValueError("no tasks")
    rec = store.get_run("r")
    assert (rec.status, rec.error) == ("failed", "ValueError: no tasks")
    assert store.lease_holder("r") is None
    store.set_run_status("r", "running")  # what a resume does: the error goes with the failure
    assert store.get_run("r").error is None
    store.close()


def test_stale_sqlite_leases_are_taken_over_and_live_ones_refused(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    store.create_run("r")
    _put_row(store, pid=4242, host="elsewhere", expires_in=-1)  # expired: its holder is gone
    with store.executing("r"):
        assert store.lease_holder("r")["pid"] == os.getpid()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _put_row(store, pid=sleeper.pid, host=socket.gethostname(), expires_in=60)
        with pytest.raises(CoevoError, match=f"^run r is being executed by pid {sleeper.pid} "):
            store.acquire_lease("r")
        sleeper.kill()
        sleeper.wait()  # dead on this host: no need to wait for the expiry
        with store.executing("r"):
            assert store.lease_holder("r")["pid"] == os.getpid()
    finally:
        sleeper.kill()
    _put_row(store, pid=4242, host="elsewhere", expires_in=60)  # alive as far as we can tell
    with pytest.raises(CoevoError, match="^run r is being executed by pid 4242 on host elsewhere since"):
        store.acquire_lease("r")
    store.close()


def test_the_heartbeat_renews_the_lease(db_url):
    store = Store.open(db_url)
    store.create_run("r")
    store.lease_ttl = 0.4  # renewed every 0.1 s
    with store.executing("r"):
        first = store.lease_holder("r")["expires_at"]
        time.sleep(1.0)
        later = store.lease_holder("r")["expires_at"]
        assert later > first and later > T.utcnow()  # past the first expiry, still held
        assert _try_from_another_process(db_url).startswith("ERR run r is being executed")
    store.close()


def test_coevo_train_holds_the_lease_and_a_failure_marks_the_run(tmp_path):
    """`coevo train --resume` of a run another execution holds stops with the one-line lease
    error before loading anything; a train that dies (a model that cannot load) leaves the run
    failed with the error and no lease."""
    import tiny_glue
    from typer.testing import CliRunner

    from coevo.cli import app

    db = f"sqlite:///{tmp_path / 't.db'}"
    store = Store.open(db)
    store.put_asset(tiny_glue.tiny_harness())
    model = f"hf:{tmp_path / 'no-model'}"
    store.create_run("t", config={"command": "train", "env": "tiny_glue:FirstCharEnv",
                                  "model": model, "steps": 10, "seed": 0}, mode="weight-only")
    store.start_round("t", 0)
    args = ["train", "--harness", "tiny", "--env", "tiny_glue:FirstCharEnv", "--run", "t",
            "--resume", "--model", model, "--db", db]
    with store.executing("t"):
        res = CliRunner().invoke(app, args)
    assert res.exit_code == 1
    assert res.output.strip().splitlines()[-1].startswith(
        f"error: run t is being executed by pid {os.getpid()} on host")
    res = CliRunner().invoke(app, args)  # now it runs, and fails loading the model
    assert res.exit_code == 1
    rec = store.get_run("t")
    assert rec.status == "failed" and "no-model" in rec.error and store.lease_holder("t") is None
    store.close()


HOLD = """
import sys, time
from coevo.store import Store
store = Store.open(sys.argv[1])
with store.executing("r"):
    store.set_run_status(store.get_run("r").id, "running")
    print("HOLDING", flush=True)
    time.sleep(300)
"""


def test_a_running_run_that_no_process_holds_is_shown_interrupted(db_url):
    """A killed run keeps `running` in the store; the listings said so, as if it still ran."""
    from coevo.audit import render_text, run_view, runs_table
    from coevo.cli_output import runs_doc

    store = Store.open(db_url)
    store.create_run("r")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, db_url], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "HOLDING"
        rec = store.get_run("r")
        assert rec.status == "running" and store.executing_now("r")
        assert store.shown_status(rec) == "running"
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 30  # PostgreSQL ends the dead session's backend, then its lock
    while store.executing_now("r") and time.monotonic() < deadline:
        time.sleep(0.2)
    rec = store.get_run("r")
    assert rec.status == "running"  # the store is unchanged: reading writes nothing
    assert store.shown_status(rec) == "interrupted"
    assert [(d["status"], d["shown_status"]) for d in runs_doc(store)] == [("running", "interrupted")]
    table = render_text(runs_table(store), width=200)
    assert "interrupted" in table and "running" not in table
    from coevo.store.lease import INTERRUPTED_HINT

    view = render_text(run_view(store, "r"), width=200)
    assert "status interrupted" in view and f"({INTERRUPTED_HINT})" in view
    from starlette.testclient import TestClient

    from coevo.serve.app import create_app
    from coevo.store.queries import open_readonly

    other = store.create_run("s")
    ro = open_readonly(db_url)
    web = TestClient(create_app(ro))
    for page in ("/", f"/runs/{rec.id}", f"/compare?run={rec.id}&run={other.id}"):
        got = web.get(page)
        assert got.status_code == 200 and ">interrupted<" in got.text.replace("<td>", ">").replace(
            "<dd>", ">").replace(" <span", "<"), page
    assert f"({INTERRUPTED_HINT})</span>" in web.get(f"/runs/{rec.id}").text  # the run page says why
    ro.close()
    store.set_run_status(rec.id, "done")
    assert store.shown_status(store.get_run("r")) == "done"
    store.close()
