"""`coevo serve`: the reviewer web app, read-only, over a store (see app.py); `--review` adds
approve / veto of the candidates a run holds for review (see review.py).

Pages: runs (and a comparison of several), a round, a proposal (diff, gate statistics and
stages, per-task evidence), both arms' episodes side by side, line blame of an asset version,
the version tree of its lineage, and a proposal search.
"""

from __future__ import annotations

import socket
from collections.abc import Callable


def serve(db: str | None = None, host: str = "127.0.0.1", port: int = 8765,
          echo: Callable[[str], None] = print, review: bool = False,
          token: str | None = None) -> None:
    """Open the store at `db` read-only and serve the app on host:port until interrupted.
    Port 0 picks a free port; the URL printed is the one bound. `review`: open it writable
    and add the approve / veto form (serve/review.py); off loopback it needs `token` (or
    $COEVO_SERVE_TOKEN)."""
    import uvicorn

    from coevo.errors import CoevoError
    from coevo.serve.app import LOOPBACK, allowed_hosts, create_app
    from coevo.serve.review import review_settings
    from coevo.store.queries import open_readonly

    settings = review_settings(host, token, host in LOOPBACK or host.startswith("127.")) \
        if review else None
    store = open_readonly(db, readonly=not review)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as e:
        sock.close()
        store.close()
        raise CoevoError(f"cannot listen on {host}:{port}: {e} (choose another --port, or 0 "
                         "for any free one)") from None
    sock.listen(128)  # connections wait in the backlog until uvicorn serves: the URL works at once
    bound = sock.getsockname()[1]
    name = f"[{host}]" if ":" in host else host
    app = create_app(store, allowed_hosts(host), settings)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    mode = "read-only" if settings is None else "review: approve / veto enabled" + (
        ", token required" if settings.token else "")
    echo(f"coevo serve: {store.url} ({mode})")
    echo(f"open http://{name}:{bound}/  (Ctrl-C stops)")
    try:
        server.run(sockets=[sock])
    finally:
        store.close()
