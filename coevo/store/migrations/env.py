"""Alembic environment for coevo's store.

Run programmatically by coevo.store.store (no alembic.ini: the script location is inside the
installed package). The caller passes an open connection in `config.attributes["connection"]`,
so migrations run inside the store's own engine setup (SQLite pragmas, explicit BEGIN); with
only a `sqlalchemy.url` option (e.g. the `alembic` command line for writing a new revision)
an engine is made here. SQLite gets batch mode, because it cannot ALTER most constraints and
batch mode recreates the table instead.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from coevo.store.tables import Base

config = context.config
target_metadata = Base.metadata


def _configure(**kwargs) -> None:
    context.configure(target_metadata=target_metadata, compare_type=True, **kwargs)


def run_offline() -> None:
    url = config.get_main_option("sqlalchemy.url")
    _configure(url=url, literal_binds=True, render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_online(connection: sa.Connection) -> None:
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
elif (conn := config.attributes.get("connection")) is not None:
    run_online(conn)
else:
    engine = sa.create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.connect() as conn:
        run_online(conn)
        conn.commit()
    engine.dispose()
