"""Where a run's files (LoRA checkpoints, published adapters) live: beside its store.

The store holds rows; the files a row points to go in a folder that belongs to that store and
is addressed by run id, never by the run's name (two projects with the same default run name
must not share a folder, and a name is user text: `../x` is not a path):

- SQLite `path/to/NAME.db`: `path/to/NAME.artifacts/<run id>/`
- any other store (PostgreSQL) or an in-memory SQLite: `$COEVO_HOME/artifacts/<store id>/<run id>/`,
  the store id a digest of the database URL without its password;
- `$COEVO_ARTIFACTS` replaces the root for every store: `$COEVO_ARTIFACTS/<store id>/<run id>/`;
- `rl.stage.checkpoint_dir` in a run config names the checkpoint folder of that run outright.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from coevo.errors import CoevoError


def coevo_home() -> Path:
    return Path(os.environ.get("COEVO_HOME") or Path.home() / ".coevo").expanduser()


def store_id(url: Any) -> str:
    """A short stable digest naming a store (its URL, password left out).

    >>> store_id("postgresql+psycopg://u:secret@h/db") == store_id("postgresql+psycopg://u:other@h/db")
    True
    """
    rendered = sa.make_url(str(url)).set(password=None).render_as_string(hide_password=False)
    return hashlib.sha256(rendered.encode()).hexdigest()[:16]


def artifacts_root(url: Any) -> Path:
    """The folder holding every run's files for the store at `url` (see the module)."""
    u = sa.make_url(str(url))
    if os.environ.get("COEVO_ARTIFACTS"):
        return Path(os.environ["COEVO_ARTIFACTS"]).expanduser() / store_id(u)
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        db = Path(u.database).expanduser().resolve()
        return db.parent / f"{db.stem}.artifacts"
    return coevo_home() / "artifacts" / store_id(u)


def run_artifacts(url: Any, run_id: str) -> Path:
    """The folder of one run's files. Run ids are generated hex; a caller-chosen id that is not
    a plain file name is digested, so no id reaches outside the root."""
    safe = run_id if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", run_id) else \
        hashlib.sha256(run_id.encode()).hexdigest()
    return artifacts_root(url) / safe


def check_writable(folder: Path, what: str) -> None:
    """Create `folder` if needed and write a file in it, or raise one line naming `what`."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".coevo-write-check-"):
            pass
    except OSError as e:
        raise CoevoError(f"{what}: {folder} is not a writable folder: "
                         f"{e.strerror or e.__class__.__name__}") from None
