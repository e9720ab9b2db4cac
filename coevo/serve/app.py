"""The reviewer web app: a Starlette application over a read-only store, pages rendered on the
server from Jinja2 templates (no script at all: forms are plain GET forms, charts are inline
SVG drawn by charts.py; with --review, one POST form, see review.py).

Security. Every template autoescapes, so text a model wrote (rationales, raw outputs, prompts,
task ids, messages) is shown, never interpreted: a `<script>` in a rationale is text. The
content security policy allows no script, no inline style and nothing from another origin,
so even a template mistake could not run one. Only GET and HEAD are routed (anything else is
405; --review adds the review POST and opens the store writable, else the store is opened
read-only and the database refuses writes), and the Host header must
name the address served (a page on another site cannot reach a loopback server through DNS
rebinding). Bad input is a 400 or 404 page that says what was wrong; an unexpected error is
a 500 page without a traceback (the traceback goes to the log).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coevo.errors import CoevoError, NotFound
from coevo.serve import proposal as P
from coevo.serve import versions as V
from coevo.serve import views
from coevo.serve.review import Refused, ReviewSettings, post_review
from coevo.serve.views import BadRequest
from coevo.store import Store
from coevo.store.lease import INTERRUPTED_HINT

log = logging.getLogger("coevo.serve")
HERE = Path(__file__).resolve().parent
HEADERS = [
    (b"content-security-policy", b"default-src 'none'; style-src 'self'; img-src 'self' data:; "
                                 b"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    # same-origin, not no-referrer: under no-referrer a browser sends `Origin: null` with a
    # form post, and the review endpoint refuses writes whose Origin is not this server.
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def short(ref: Any, n: int = 12) -> str:
    return str(ref)[:n] if ref else "-"


def fmt(value: Any, digits: int = 3) -> str:
    """A number for a table: "-" when missing, integers without decimals."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:.{digits}f}"


def signed(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:+.{digits}f}"


def when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value else "-"


def templates() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(short=short, fmt=fmt, signed=signed, when=when)
    env.globals["reward_rows"] = P.reward_rows
    env.globals["review_mode"] = False
    env.globals["interrupted_hint"] = INTERRUPTED_HINT
    return env


class SecurityHeaders:
    """Adds HEADERS to every response (pages, errors and the stylesheet alike)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], *HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def _int(request: Request, name: str, default: int, minimum: int = 0) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name}: expected a whole number, got {raw!r}") from None
    if value < minimum:
        raise BadRequest(f"{name}: must be at least {minimum}, got {value}")
    return value


def create_app(store: Store, allowed_hosts: Sequence[str] = ("*",),
               review: ReviewSettings | None = None) -> Starlette:
    """The app over `store` (open it with coevo.store.queries.open_readonly). `allowed_hosts`:
    the Host header values accepted ("*": any). `review` (coevo serve --review, a writable
    store): the approve / veto form and its one POST endpoint (coevo/serve/review.py);
    without it no route writes."""
    env = templates()
    env.globals["review_mode"] = review is not None

    def render(name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(**ctx), status_code=status)

    def failed(request: Request, e: Exception) -> Response:
        if isinstance(e, Refused):
            return render("error.html", 403, code=403, title="refused", message=str(e))
        if isinstance(e, NotFound):
            return render("error.html", 404, code=404, title="not found", message=str(e))
        if isinstance(e, CoevoError):  # BadRequest among them
            return render("error.html", 400, code=400, title="bad request", message=str(e))
        log.exception("%s failed", request.url.path)
        return render("error.html", 500, code=500, title="internal error",
                      message="the page failed to render; the server log has the details")

    def page(name: str, build: Callable[[Request], dict[str, Any]]) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            try:
                return render(name, **build(request))
            except Exception as e:
                return failed(request, e)
        return endpoint

    async def review_endpoint(request: Request) -> Response:
        try:
            return await post_review(request, store, review)  # type: ignore[arg-type]
        except Exception as e:
            return failed(request, e)

    def p(request: Request) -> dict[str, Any]:
        return request.path_params

    routes = [
        Route("/", page("runs.html", lambda r: views.runs_page_view(store, _int(r, "page", 1, 1)))),
        Route("/compare", page("compare.html", lambda r: views.compare_view(
            store, r.query_params.getlist("run")))),
        Route("/runs/{run}", page("run.html", lambda r: views.run_view(
            store, p(r)["run"], _int(r, "page", 1, 1)))),
        Route("/runs/{run}/rounds/{index}", page("round.html", lambda r: views.round_view(
            store, p(r)["run"], _path_int(p(r)["index"], "round")))),
        Route("/proposals", page("search.html", lambda r: views.search_view(
            store, dict(r.query_params), _int(r, "page", 1, 1)))),
        Route("/proposals/{pid}", page("proposal.html", lambda r: {**P.proposal_view(
            store, p(r)["pid"], r.query_params.get("show") or "all", _int(r, "page", 1, 1)),
            "form": review.form() if review else None})),
        Route("/proposals/{pid}/pair", page("pair.html", lambda r: P.pair_view(
            store, p(r)["pid"], r.query_params.get("task", ""), _int(r, "sample", 0, 0)))),
        Route("/trajectories/{tid}", page("trajectory.html", lambda r: P.trajectory_view(
            store, p(r)["tid"]))),
        Route("/versions/{ref}/blame", page("blame.html", lambda r: V.blame_view(store, p(r)["ref"]))),
        Route("/versions/{ref}/lineage", page("lineage.html", lambda r: V.lineage_view(
            store, p(r)["ref"]))),
        Route("/assets", page("assets.html", lambda r: views.assets_view(store))),
        Route("/static/style.css", lambda r: FileResponse(HERE / "static" / "style.css",
                                                          media_type="text/css")),
    ]
    if review is not None:
        routes.append(Route("/proposals/{pid}/review", review_endpoint, methods=["POST"]))

    async def http_error(request: Request, exc: Exception) -> Response:
        code = exc.status_code if isinstance(exc, HTTPException) else 500
        message = {404: f"no page at {request.url.path}",
                   405: f"{request.method} is not allowed here" + (
                       "" if review else ": this app only reads (coevo serve --review adds "
                       "the review form)")}.get(
            code, getattr(exc, "detail", "error"))
        return render("error.html", code, code=code, title={404: "not found", 405: "read-only"}
                      .get(code, "error"), message=message)

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error},
                    middleware=[Middleware(SecurityHeaders),
                                Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))])
    app.state.store = store
    return app


def _path_int(raw: str, name: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name}: expected a whole number, got {raw!r}") from None
    if value < 0:
        raise BadRequest(f"{name}: must be at least 0, got {value}")
    return value


def allowed_hosts(host: str) -> list[str]:
    """Host header values to accept when serving on `host`: the loopback names for a loopback
    address (DNS rebinding protection), any for a wildcard address, else that host."""
    if host in LOOPBACK or host.startswith("127."):
        return ["127.0.0.1", "localhost", "[::1]", "::1", host]
    if host in ("0.0.0.0", "::", ""):
        return ["*"]
    return [host, "127.0.0.1", "localhost"]
