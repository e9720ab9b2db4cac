"""`coevo serve --review`: approve / veto a candidate the run holds for review, from its page.

The only write the app has, and only when started with --review: POST /proposals/{id}/review
with a plain form (decision, by, note). Each write is checked, in this order:
- the request is not cross-site: a browser's `Sec-Fetch-Site` is same-origin (or absent), and
  an `Origin` header, when sent, names this very server (the Host check of app.py already
  refused foreign Host names, which is what stops DNS rebinding);
- the form carries this server's secret (a random per-process value in a hidden field, which
  another site cannot read: a forged form fails);
- with a token (`--token` or COEVO_SERVE_TOKEN; required off loopback, where anyone who can
  reach the port could read the secret from a page), the form's token field equals it. Both
  values are compared in constant time.
The review itself goes through the store's `add_review`, whose refusals (not pending review,
already reviewed, no name) come back as a 400 page with that one line.
"""

from __future__ import annotations

import hmac
import os
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from coevo.errors import CoevoError
from coevo.store import Store

TOKEN_ENV = "COEVO_SERVE_TOKEN"
MAX_FORM = 64 * 1024  # bytes: a name and a note


class Refused(CoevoError):
    """A write the server will not take (cross-site, stale form, wrong token): 403."""


@dataclass(frozen=True)
class ReviewSettings:
    """What --review turned on: the token every write needs (None: none asked, loopback only)
    and the per-process form secret."""

    token: str | None = None
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    def form(self) -> dict[str, Any]:
        """What the proposal page's form needs."""
        return {"secret": self.secret, "ask_token": self.token is not None}


def review_settings(host: str, token: str | None, loopback: bool) -> ReviewSettings:
    """Settings for `coevo serve --review` on `host`: the token from --token or the
    environment; refused without one off loopback."""
    token = token or os.environ.get(TOKEN_ENV) or None
    if token is None and not loopback:
        raise CoevoError(f"--review on {host} (not loopback) needs a token: pass --token or set "
                         f"{TOKEN_ENV}; reviewers type it into the review form")
    return ReviewSettings(token=token)


def _same(given: str, want: str) -> bool:
    return hmac.compare_digest(given.encode(), want.encode())


def check_write(request: Request, form: dict[str, str], settings: ReviewSettings) -> None:
    """Raise Refused unless the write passes every check of the module docstring."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise Refused(f"a {site} request cannot write")
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise Refused(f"a form from {origin} cannot write here")
    if not _same(form.get("csrf", ""), settings.secret):
        raise Refused("the form is not this server's (stale after a restart?): reload the page")
    if settings.token is not None and not _same(form.get("token", ""), settings.token):
        raise Refused("wrong or missing review token")


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form body (first value of each field); anything else is refused."""
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind != "application/x-www-form-urlencoded":
        raise Refused(f"expected a form post, got {kind or 'no content type'}")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_FORM:  # refused before reading it
        raise Refused(f"the form is over {MAX_FORM // 1024} KiB")
    body = await request.body()
    if len(body) > MAX_FORM:
        raise Refused(f"the form is over {MAX_FORM // 1024} KiB")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise Refused("the form is not UTF-8") from None
    return {k: v[0] for k, v in fields.items()}


async def post_review(request: Request, store: Store, settings: ReviewSettings) -> Response:
    """Check the write, record the review, and send the reviewer back to the proposal page."""
    pid = request.path_params["pid"]
    form = await read_form(request)
    check_write(request, form, settings)
    decision = form.get("decision", "")
    await run_in_threadpool(store.add_review, pid, decision=decision, by=form.get("by", ""),
                            note=form.get("note", "").strip())
    return RedirectResponse(f"/proposals/{quote(pid, safe='')}#review", status_code=303)
