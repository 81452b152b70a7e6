"""The dashboard's routes under ``/dashboard``: sign-in, pages, assets, and its API.

Every path but the sign-in page needs a session (``gateway.dashboard.session``): a page
without one redirects to the sign-in page, anything else gets a 401. A session holds only
while the admin key it was signed in with does: each request asks the ingress's
:class:`~gateway.auth.gate.Authenticator` (its key cache, dropped by ``llmgw.auth.keys.changed``),
and a bootstrap ``admin_key`` session while that key is configured. Sign-out ends the
session here and announces its id on ``llmgw.dashboard.session.ended``, so every ingress
refuses it from then on. The API
``/dashboard/api/<path>`` is the admin HTTP API itself: the request, with the session's admin
as its caller, goes to the very handler ``/<path>`` has (``forward``), so a change made here
is the admin command the CLI and the HTTP API send, answered by its owner and audited as
``dashboard:<admin key id>``. Every
API call carries the session's CSRF token (``x-csrf-token``) except the event stream
(an EventSource cannot send headers; it only reads). Every answer under ``/dashboard``, the
API's JSON and errors included, carries ``no-store``, ``nosniff`` and the CSP. Replay reports are
the one thing read from files: ``dashboard.reports_dir`` (``reports.py``), listed at
``/dashboard/api/reports`` and served read-only under ``/dashboard/report-files/``.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

import msgspec

from gateway.auth.admin_access import BY_SCOPE_KEY, CALLER_SCOPE_KEY, STILL_ALLOWED_SCOPE_KEY
from gateway.auth.gate import BOOTSTRAP_ADMIN, Authenticator, Caller, follow, unfollow
from gateway.dashboard.pages import PAGES, render_page, render_signin
from gateway.dashboard.reports import ReportsFolder
from gateway.dashboard.session import (
    BOOTSTRAP,
    COOKIE,
    SIGNIN_COOKIE,
    Session,
    SessionSigner,
    deployment_secret,
)
from schemas import (
    DashboardSessionEnded,
    ForbiddenError,
    GatewayError,
    RouteNotFoundError,
    UnauthorizedError,
    subjects,
)

if TYPE_CHECKING:
    import asyncio

    from bus import Bus
    from gateway.http.request import HttpRequest
    from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)

PREFIX = "/dashboard"
API = "/dashboard/api"
STATIC = "/dashboard/static/"
SIGNIN = "/dashboard/signin"
SIGNOUT = "/dashboard/signout"
REPORTS_API = "/dashboard/api/reports"  # the replay reports' listing (``reports.py``)
REPORT_FILES = "/dashboard/report-files/"  # <report>/<file>: read by <img> too, so no CSRF
# What the API may reach: the admin surfaces, nothing of /v1 or the dashboard itself.
FORWARDED = ("/admin/", "/api/fallback/routing-rules", "/health/deep", "/events")
_ASSETS = {
    "dashboard.js": b"text/javascript; charset=utf-8",
    "dashboard.css": b"text/css; charset=utf-8",
    # uPlot, the charts' library, vendored as package data (static/VENDORED.md).
    "uPlot.iife.min.js": b"text/javascript; charset=utf-8",
    "uPlot.min.css": b"text/css; charset=utf-8",
    "charts.js": b"text/javascript; charset=utf-8",
}
SESSION_OVER = (b"x-llmgw-dashboard-session", b"none")  # on the 401 of a request without one
_MAX_FORM = 4096
_SIGNIN_SECONDS = 3600  # how long a sign-in form stays good
_HTML = (b"content-type", b"text/html; charset=utf-8")
_SECURITY = [
    (b"cache-control", b"no-store"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        b"img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    ),
]
_encode = msgspec.json.Encoder().encode

Handler = Callable[["HttpRequest"], Awaitable[None]]


class Dashboard:
    """Serves ``/dashboard``. Owns the session signer (its secret and this ingress's view of
    ended sessions, fed by every ingress's sign-outs over the bus); holds no other state:
    every datum comes from the admin API it forwards to."""

    def __init__(
        self,
        bus: Bus,
        config: GatewayConfig,
        auth: Authenticator,
        forward: Handler,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._bus = bus
        self._auth = auth
        self._forward = forward
        self._clock = clock
        self._signer = SessionSigner(deployment_secret(config))
        self._assets = {
            name: (resources.files(__package__) / "static" / name).read_bytes() for name in _ASSETS
        }
        self._watcher: asyncio.Task[None] | None = None
        self.reconfigure(config)

    def reconfigure(self, config: GatewayConfig) -> None:
        """Follow a reloaded config (the session lifetime, the bootstrap admin key whose
        sessions hold; the secret stays)."""
        self._config = config
        self._reports = ReportsFolder(config.dashboard.reports_dir)
        self._bootstrap = (
            self._signer.bootstrap_fingerprint(config.admin_key) if config.admin_key else None
        )

    async def start(self) -> None:
        """Follow sign-outs of every ingress. Raises what ``Bus.subscribe`` raises."""
        self._watcher = await follow(
            self._bus, subjects.DASHBOARD_SESSION_ENDED, self._on_ended, name="dashboard-sessions"
        )

    async def aclose(self) -> None:
        """Stop following sign-outs."""
        watcher, self._watcher = self._watcher, None
        await unfollow(watcher)

    async def _on_ended(self, msg: object) -> None:
        if isinstance(msg, DashboardSessionEnded):
            self._signer.ended.end(msg.session, msg.expires, self._clock())

    async def handle(self, req: HttpRequest) -> None:
        """One dashboard request. Raises UnauthorizedError / ForbiddenError (no session, bad
        CSRF token) and whatever the forwarded admin handler raises."""
        # Every answer, the API's JSON and its errors included: a once-shown key or any admin
        # datum must not be cached, sniffed or framed.
        req.extra_headers = list(_SECURITY)
        path = req.path
        if path == SIGNIN:
            if req.method == "POST":
                await self._signin(req)
            else:
                query = dict(parse_qsl(req.scope.get("query_string", b"").decode("latin-1")))
                await self._signin_page(req, after=_page_after(query.get("next")))
            return
        signed_in = await self._session(req)
        if path in (PREFIX, PREFIX + "/"):
            await _redirect(req, f"{PREFIX}/overview" if signed_in else SIGNIN)
            return
        page = path[len(PREFIX) + 1 :]
        if signed_in is None:
            if req.method == "GET" and page in PAGES:
                # Back to this page after signing in (an expired session mid-work).
                await _redirect(req, f"{SIGNIN}?next={page}")
                return
            # Said apart from any other 401 (an explain as a caller whose key is bad): the
            # page goes to sign in on this one only.
            req.extra_headers.append(SESSION_OVER)
            raise UnauthorizedError("the dashboard needs a session: sign in at " + SIGNIN)
        session, caller = signed_in
        if path == SIGNOUT and req.method == "POST":
            await self._signout(req, session)
        elif path == REPORTS_API and req.method == "GET":
            self._check_csrf(req, session)
            await req.respond(200, _encode(await self._reports.listing()))
        elif path.startswith(REPORT_FILES) and req.method == "GET":
            report, _, name = path[len(REPORT_FILES) :].partition("/")
            body, content_type = await self._reports.read(report, name)
            await _bytes(req, body, content_type)
        elif path.startswith(API + "/"):
            await self._api(req, session, caller)
        elif path.startswith(STATIC) and req.method == "GET":
            await self._asset(req, path[len(STATIC) :])
        elif req.method == "GET" and page in PAGES:
            await _html(req, 200, render_page(page, self._signer.csrf(session), session.key_id))
        else:
            raise _not_found(path)

    # -- sessions -----------------------------------------------------------------------

    async def _session(self, req: HttpRequest) -> tuple[Session, Caller] | None:
        """The request's session and its admin; None without a valid session, or once the
        admin key it was signed in with is revoked, expired or no longer configured."""
        token = _cookie(req, COOKIE)
        session = self._signer.verify(token, self._clock()) if token else None
        if session is None:
            return None
        caller = await self._admin_of(session)
        return (session, caller) if caller is not None else None

    async def _still_on(self, session: Session) -> bool:
        """Whether ``session`` holds still: not expired, not signed out, its key valid."""
        return (
            session.expires > self._clock()
            and session.nonce not in self._signer.ended
            and await self._admin_of(session) is not None
        )

    async def _admin_of(self, session: Session) -> Caller | None:
        """The admin of a verified session; None once its admin key is revoked, expired or
        no longer configured."""
        if session.key_hash.startswith(BOOTSTRAP):
            configured = self._bootstrap is not None and hmac.compare_digest(
                session.key_hash, self._bootstrap
            )
            return BOOTSTRAP_ADMIN if configured else None
        return await self._auth.admin_of_hash(session.key_hash)

    async def _signin_page(
        self, req: HttpRequest, status: int = 200, error: str = "", after: str = "overview"
    ) -> None:
        """The sign-in form with a fresh pre-session cookie and its token (double submit)."""
        nonce = secrets.token_urlsafe(16)
        cookie = (
            f"{SIGNIN_COOKIE}={nonce}; Path={SIGNIN}; HttpOnly; SameSite=Strict; "
            f"Max-Age={_SIGNIN_SECONDS}"
        )
        cookie += _secure(req)
        body = render_signin(self._signer.signin_csrf(nonce), error, after)
        await _html(req, status, body, [(b"set-cookie", cookie.encode())])

    async def _signin(self, req: HttpRequest) -> None:
        form = dict(parse_qsl((await req.body(_MAX_FORM)).decode("utf-8", "replace")))
        after = _page_after(form.get("next"))
        if not self._signer.signin_ok(_cookie(req, SIGNIN_COOKIE), form.get("csrf")):
            await self._signin_page(
                req,
                403,
                "the sign-in form was not sent from this page or has expired: try again",
                after,
            )
            return
        key = form.get("key", "").strip()
        try:
            caller = await self._auth.identify_key(key, strict=True) if key else None
        except UnauthorizedError as err:
            await self._signin_page(req, 401, err.message, after)
            return
        if caller is None:
            await self._signin_page(req, 401, "unknown key", after)
            return
        if not caller.is_admin:
            await self._signin_page(
                req,
                403,
                f"a key of role {caller.role!r} cannot sign in: the dashboard needs an admin key",
                after,
            )
            return
        lifetime = self._config.dashboard.session_seconds
        fingerprint = self._bootstrap if caller is BOOTSTRAP_ADMIN else caller.key_hash
        if fingerprint is None:  # an admin is one or the other: never
            raise UnauthorizedError("unknown key")
        token, _ = self._signer.issue(
            caller.key_id or "admin", fingerprint, self._clock(), lifetime
        )
        logger.info("dashboard: %s signed in", caller.key_id or "admin")
        cookie = (
            f"{COOKIE}={token}; Path={PREFIX}; HttpOnly; SameSite=Strict; Max-Age={int(lifetime)}"
        )
        cookie += _secure(req)
        await _redirect(req, f"{PREFIX}/{after}", [(b"set-cookie", cookie.encode())])

    async def _signout(self, req: HttpRequest, session: Session) -> None:
        form = dict(parse_qsl((await req.body(_MAX_FORM)).decode("utf-8", "replace")))
        self._check_csrf(req, session, form.get("csrf"))
        self._signer.ended.end(session.nonce, session.expires, self._clock())
        # Every other ingress too; the id only: the token stays with the browser.
        await self._bus.publish(
            subjects.DASHBOARD_SESSION_ENDED,
            DashboardSessionEnded(session=session.nonce, expires=session.expires),
        )
        logger.info("dashboard: %s signed out", session.key_id)
        expired = f"{COOKIE}=; Path={PREFIX}; HttpOnly; SameSite=Strict; Max-Age=0{_secure(req)}"
        await _redirect(req, SIGNIN, [(b"set-cookie", expired.encode())])

    def _check_csrf(self, req: HttpRequest, session: Session, presented: str | None = None) -> None:
        if not self._signer.csrf_ok(session, presented or req.header("x-csrf-token")):
            raise ForbiddenError("missing or wrong CSRF token (x-csrf-token)")

    # -- API and assets -----------------------------------------------------------------

    async def _api(self, req: HttpRequest, session: Session, caller: Caller) -> None:
        inner = req.path[len(API) :]
        if not inner.startswith(FORWARDED) or inner.startswith("/admin/dashboard"):
            raise _not_found(req.path)
        if not (req.method == "GET" and inner == "/events"):
            self._check_csrf(req, session)
        else:  # a stream outlives this check: it ends once the session does
            req.scope[STILL_ALLOWED_SCOPE_KEY] = lambda: self._still_on(session)
        raw = req.scope.get("raw_path")
        if raw is not None:  # the admin path is split on its raw form (%2F is no separator)
            forwarded = bytes(raw)[len(API) :]
            # After the API's own raw prefix, a raw "/" (not "%2F", whose segment the split
            # would drop): the path forwarded is then the one ``inner`` checked.
            if not bytes(raw).startswith(API.encode()) or not forwarded.startswith(b"/"):
                raise _not_found(req.path)
            req.scope["raw_path"] = forwarded
        req.scope["path"] = inner
        req.scope[CALLER_SCOPE_KEY] = caller
        req.scope[BY_SCOPE_KEY] = f"dashboard:{session.key_id}"
        await self._forward(req)

    async def _asset(self, req: HttpRequest, name: str) -> None:
        body = self._assets.get(name)
        if body is None:
            raise _not_found(req.path)
        await _bytes(req, body, _ASSETS[name])


async def _bytes(req: HttpRequest, body: bytes, content_type: bytes) -> None:
    await req.start(
        200, [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    )
    await req.chunk(body, more=False)


def _secure(req: HttpRequest) -> str:
    """``; Secure`` when the browser reached the dashboard over https: directly, or through a
    TLS-terminating proxy that says so (``X-Forwarded-Proto`` / ``Forwarded: proto=``). The
    gateway serves plain HTTP itself, so without the proxy's word no cookie was ever Secure.
    Trusting the header is safe here: it can only restrict the sender's own cookie."""
    if req.scope.get("scheme") == "https":
        return "; Secure"
    proto = (req.header("x-forwarded-proto") or "").split(",", 1)[0].strip().lower()
    forwarded = (req.header("forwarded") or "").split(",", 1)[0].lower().replace(" ", "")
    https = proto == "https" or any(p == "proto=https" for p in forwarded.split(";"))
    return "; Secure" if https else ""


def _page_after(name: str | None) -> str:
    """The page a sign-in goes on to: ``name`` when it names a page (never a URL: no open
    redirect), else the overview."""
    return name if name in PAGES else "overview"


def _not_found(path: str) -> GatewayError:
    return RouteNotFoundError(f"no such path {path}")


def _cookie(req: HttpRequest, name: str) -> str | None:
    raw = req.header("cookie")
    if not raw:
        return None
    for part in raw.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value or None
    return None


async def _html(
    req: HttpRequest, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await req.start(status, [_HTML, (b"content-length", str(len(body)).encode()), *(headers or ())])
    await req.chunk(body, more=False)


async def _redirect(
    req: HttpRequest, to: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await req.start(303, [(b"location", to.encode()), (b"content-length", b"0"), *(headers or ())])
    await req.chunk(b"", more=False)
