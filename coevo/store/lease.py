"""Run leases: at most one process executes a run at a time.

Two processes resuming one run would both decide every proposal, write duplicate checkpoints
and trajectories and lose each other's round summaries. So whoever executes a run (the loop,
`coevo train`) holds its lease for the whole execution, and a second process gets one line:
"run X is being executed by pid P on host H since T".

- PostgreSQL: a session-level `pg_try_advisory_lock` on a key derived from the run id, held on
  a connection of its own for the run's duration. The server releases it when that connection
  ends, however the process died. The `run_leases` row only says who holds it.
- SQLite: the `run_leases` row is the lease. It is taken in one transaction (coevo's SQLite
  transactions start with BEGIN IMMEDIATE, so two takers queue and the second sees the first's
  row), renewed by a heartbeat thread, and may be taken over once stale: expired (its holder
  stopped renewing: a crash on another host, a suspended process), or held by a process of this
  host that no longer runs (a SIGKILLed run resumed at once need not wait for the expiry).

`executing(run)` holds the lease around a block and marks the run `failed`, with the error,
when the block raises; the lease is released on every exit.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import sqlalchemy as sa

from coevo.errors import CoevoError
from coevo.store import tables as T
from coevo.store.base import StoreBase, new_id
from coevo.store.records import RunRecord

log = logging.getLogger("coevo.store.lease")
LEASE_TTL_S = 60.0  # a lease not renewed for this long is stale; renewed every TTL / 4
# What a reader is told next to an `interrupted` run (shown_status), in the audit and the app.
INTERRUPTED_HINT = "stored as running; no process executes it: resume it by name"


def advisory_key(run_id: str) -> int:
    """The PostgreSQL advisory-lock key of a run: a signed 64-bit digest of its id.

    >>> advisory_key("r1") == advisory_key("r1") != advisory_key("r2")
    True
    """
    return int.from_bytes(hashlib.blake2b(f"coevo-run:{run_id}".encode(), digest_size=8).digest(),
                          "big", signed=True)


def _process_gone(pid: int) -> bool:
    """True when no process `pid` runs on this host (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


class Lease:
    """A held run lease; `release()` gives it back (idempotent)."""

    def __init__(self, store: "LeaseStore", run_id: str, token: str, ttl: float,
                 conn: sa.Connection | None = None):
        self.store, self.run_id, self.token, self.ttl, self._conn = store, run_id, token, ttl, conn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{run_id[:8]}", daemon=True)
        # An in-memory SQLite database is one connection's own (another thread would open an
        # empty one, another process cannot see it): nothing to renew against.
        if store.engine.url.database not in (None, "", ":memory:"):
            self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                if not self.store._renew_lease(self.run_id, self.token, self.ttl):
                    log.error("run %s: the lease was taken over by another process", self.run_id)
                    return
            except Exception as e:  # a busy or unreachable database: try again next beat
                log.warning("run %s: lease heartbeat failed: %s", self.run_id, e)

    def release(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        try:
            self.store._drop_lease(self.run_id, self.token)
        finally:
            if self._conn is not None:
                self._conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"),
                                   {"k": advisory_key(self.run_id)})
                self._conn.close()


class LeaseStore(StoreBase):
    lease_ttl: float = LEASE_TTL_S

    @contextmanager
    def executing(self, run: str) -> Iterator[Lease]:
        """Hold `run`'s lease around the block; if the block raises, the run is marked
        `failed` with the error (then the error propagates). Released on every exit."""
        lease = self.acquire_lease(run)
        try:
            yield lease
        except Exception as e:
            self.set_run_status(lease.run_id, "failed", error=f"{type(e).__name__}: {e}")
            raise
        finally:
            lease.release()

    def acquire_lease(self, run: str) -> Lease:
        """Take `run`'s lease or raise CoevoError naming who holds it (see the module)."""
        run_id = self.get_run(run).id
        token, ttl = new_id(), self.lease_ttl
        if self.engine.dialect.name != "postgresql":
            self._take_row(run_id, token, ttl, takeover=self._stale)
            return Lease(self, run_id, token, ttl)
        conn = self.engine.connect()
        try:
            got = conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"),
                               {"k": advisory_key(run_id)}).scalar()
            conn.commit()  # the lock is session-level: it outlives this transaction
            if not got:
                raise self._busy(run_id, self._lease_row(run_id))
            self._take_row(run_id, token, ttl, takeover=lambda row, now: True)
        except BaseException:
            conn.close()  # closing the session releases a lock it took
            raise
        return Lease(self, run_id, token, ttl, conn)

    # --- the row ------------------------------------------------------------------------------

    def _take_row(self, run_id: str, token: str, ttl: float, takeover) -> None:
        with self.transaction() as s:
            now = T.utcnow()
            row = s.get(T.RunLease, run_id)
            if row is not None:
                if not takeover(row, now):
                    raise self._busy(run_id, row)
                log.info("run %s: taking over the stale lease of pid %s on %s",
                         run_id, row.pid, row.host)
                s.delete(row)
                s.flush()
            s.add(T.RunLease(run_id=run_id, token=token, pid=os.getpid(), host=socket.gethostname(),
                             started_at=now, heartbeat_at=now,
                             expires_at=now + timedelta(seconds=ttl)))

    @staticmethod
    def _stale(row: T.RunLease, now: datetime) -> bool:
        return row.expires_at < now or (row.host == socket.gethostname()
                                        and row.pid != os.getpid() and _process_gone(row.pid))

    def _renew_lease(self, run_id: str, token: str, ttl: float) -> bool:
        t = T.RunLease.__table__
        with self.transaction() as s:
            now = T.utcnow()
            return s.execute(sa.update(t).where(t.c.run_id == run_id, t.c.token == token).values(
                heartbeat_at=now, expires_at=now + timedelta(seconds=ttl))).rowcount == 1

    def _drop_lease(self, run_id: str, token: str) -> None:
        t = T.RunLease.__table__
        with self.transaction() as s:
            s.execute(sa.delete(t).where(t.c.run_id == run_id, t.c.token == token))

    def _lease_row(self, run_id: str) -> T.RunLease | None:
        with self.transaction() as s:
            return s.get(T.RunLease, run_id)

    def _busy(self, run_id: str, row: T.RunLease | None) -> CoevoError:
        name = self.get_run(run_id).name
        if row is None:  # PostgreSQL: locked, the holder's row not yet written
            return CoevoError(f"run {name} is being executed by another process")
        since = row.started_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        return CoevoError(f"run {name} is being executed by pid {row.pid} on host {row.host} "
                          f"since {since}")

    def executing_now(self, run: str) -> bool:
        """Whether a live process holds `run`'s lease now (PostgreSQL: its advisory lock is
        granted to some session; SQLite: its row is there and not stale)."""
        return self._executing(self.get_run(run).id)

    def _executing(self, run_id: str) -> bool:
        if self.engine.dialect.name == "postgresql":
            key = advisory_key(run_id) & 0xFFFFFFFFFFFFFFFF  # pg_locks splits it in two oids
            with self.engine.connect() as conn:
                return bool(conn.execute(sa.text(
                    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
                    " AND classid::bigint = :hi AND objid::bigint = :lo AND objsubid = 1)"),
                    {"hi": key >> 32, "lo": key & 0xFFFFFFFF}).scalar())
        row = self._lease_row(run_id)
        return row is not None and not self._stale(row, T.utcnow())

    def shown_status(self, rec: RunRecord) -> str:
        """A run's status as a reader needs it: `interrupted` for one stored as `running` that
        no live process executes (killed, or its machine went away: `--resume` continues it);
        else the stored status. Reading changes nothing."""
        if rec.status == "running" and not self._executing(rec.id):  # the record is at hand
            return "interrupted"
        return rec.status

    def lease_holder(self, run: str) -> dict | None:
        """Who holds `run`'s lease (pid, host, started_at, expires_at), None when nobody."""
        row = self._lease_row(self.get_run(run).id)
        return None if row is None else {"pid": row.pid, "host": row.host,
                                         "started_at": row.started_at,
                                         "expires_at": row.expires_at}
