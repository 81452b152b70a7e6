"""Who is calling: gateway API keys checked on the ingress, cheaply.

Auth is on once any gateway API key exists, or with ``auth: required``; then
every ``/v1/*`` call needs a valid key (missing, unknown, expired or revoked -> 401 in the
surface's error shape). Otherwise the gateway runs open (and says so at startup): anonymous
callers get the lowest role, ``free``. Every ``/admin/*`` call needs an admin key (a key of
role ``admin``, or the bootstrap ``admin_key`` / ``LLMGW_ADMIN_KEY``): none -> 401, another
role -> 403. With auth on, ``/routing`` and ``/health/deep`` need a valid key too (their
handlers show only the models its role may call), and ``/metrics`` an ``internal`` or
``admin`` one (metrics name every model), unless ``metrics.public`` opens it to anyone. On
other paths (``/health``, ``/health/ready``: probes) a presented key is identified when valid
and ignored otherwise.

The identified caller is stored in the ASGI scope (``llmgw.caller``) for the handlers:
``caller_of(req)``. The keys' owner is the ApiKeyAdminActor; the ingress never opens its
table. A key is looked up by its sha256 over the bus (``llmgw.auth.keys.lookup``) and the answer
cached per ingress for ``auth_cache_seconds`` (unknown ones too, in a bounded cache); an
``ApiKeyRevoked`` / ``ApiKeyCreated`` event on ``llmgw.auth.keys.changed`` drops the entry on
every ingress at once, and an expiry holds from its instant (the answer carries it). Whether
auth is on comes from the owner too (``llmgw.auth.state``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.auth.admin_access import CALLER_SCOPE_KEY
from schemas import (
    ApiKeyCreated,
    ApiKeyInfo,
    ApiKeyLookup,
    ApiKeyRevoked,
    AuthBusyError,
    AuthState,
    AuthStateRequest,
    ForbiddenError,
    GatewayError,
    UnauthorizedError,
    raise_for_reply,
    subjects,
)
from schemas.keys import hash_key, role_rank

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from bus import Bus
    from gateway.http.request import HttpRequest
    from schemas.config import GatewayConfig, ModelConfig

logger = logging.getLogger(__name__)

SCOPE_KEY = CALLER_SCOPE_KEY
_CACHE_MAX = 10_000
# Distinct key hashes this ingress asks the key owner about at once; a miss beyond it is
# answered 503 auth_busy (Retry-After) without a bus request, so a flood of made-up keys
# costs the single owner at most this many requests in flight per ingress.
LOOKUPS_MAX = 64
# A miss joins a lookup of its hash asked at most this long ago. A lookup answers in
# milliseconds; one older was most likely taken by an owner that died holding it (kill -9 of
# its host), and it fails only at its timeout: a caller arriving later asks whoever owns the
# keys now instead of inheriting that failure.
JOIN_S = 1.0
_BUSY_RETRY_AFTER_S = 1.0
MEND_WAIT_S = 1.0
"""How long a caller waits for the owner's word on whether auth is on, once it has said it
(the owner answers in a millisecond, a busy one well within this; one that does not is down or
the bus is, and routing will say so)."""
_KEYED = frozenset({"/routing", "/health/deep"})  # with auth on: a valid key, any role
METRICS = "/metrics"
METRICS_ROLE = "internal"  # and above: /metrics with auth on (unless metrics.public)


@dataclass(frozen=True, slots=True)
class Caller:
    """An identified caller: its key's hash (None: anonymous), role and owner."""

    key_hash: str | None
    role: str
    key_id: str = ""
    org: str = ""
    user: str = ""

    @property
    def is_admin(self) -> bool:
        """Whether this caller may use the admin surfaces."""
        return self.role == "admin"


ANONYMOUS = Caller(key_hash=None, role="free")
BOOTSTRAP_ADMIN = Caller(key_hash="bootstrap-admin", role="admin", key_id="bootstrap-admin")


def caller_of(req: HttpRequest) -> Caller:
    """The caller the auth gate identified for ``req`` (anonymous when none)."""
    caller = req.scope.get(SCOPE_KEY)
    return caller if isinstance(caller, Caller) else ANONYMOUS


def may_call(req: HttpRequest, model: ModelConfig) -> bool:
    """Whether ``req``'s caller may see and call ``model`` (its ``required_role``)."""
    need = model.required_role
    return need is None or role_rank(caller_of(req).role) >= role_rank(need)


class Authenticator:
    """Owns the ingress's bounded cache of key answers and its view of whether auth is on.

    Keys belong to the ApiKeyAdminActor; this asks it over the bus on a cache miss
    (``llmgw.auth.keys.lookup``, by hash) and follows ``llmgw.auth.keys.changed`` and
    ``llmgw.auth.state``. Concurrent misses of one hash share one request; at most
    :data:`LOOKUPS_MAX` distinct hashes are asked at once. Raises UnauthorizedError /
    ForbiddenError from :meth:`gate`, AuthBusyError when a miss finds no lookup slot free, and
    the bus's GatewayError (no responders, timeout) when the owner cannot answer a miss.
    """

    def __init__(
        self, bus: Bus, config: GatewayConfig, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._bus = bus
        self._clock = clock  # monotonic seconds: the cache's age and a lookup's
        self._cache: dict[str, tuple[ApiKeyInfo, float]] = {}
        # The lookup each hash's misses wait on and when it was asked; an entry forgotten
        # while in flight (a key event, a reload, one older than JOIN_S) is answered to its
        # waiters but never cached.
        self._asking: dict[str, tuple[asyncio.Task[ApiKeyInfo], float]] = {}
        self._outstanding = 0
        self._any_keys: bool | None = None  # None: the owner has not said yet
        self._any_checked = float("-inf")
        # The one AuthStateRequest in flight: every request arriving while the answer is
        # stale waits on it instead of asking again (64 callers must not ask 64 times).
        self._checking: asyncio.Task[None] | None = None
        self._watchers: list[asyncio.Task[None]] = []
        self._settle(config)

    def reconfigure(self, config: GatewayConfig) -> None:
        """Apply a reloaded config's ``auth``, ``auth_cache_seconds``, ``admin_key`` and
        ``routing.decision_timeout_seconds`` from the next request on (cached keys are asked
        for again)."""
        was_required = self._required
        self._settle(config)
        self._cache.clear()
        self._asking.clear()
        if self._required != was_required:
            logger.warning(
                "auth: %s by the reloaded config",
                "required" if self._required else "no longer required",
            )

    def _settle(self, config: GatewayConfig) -> None:
        self._ttl = config.auth_cache_seconds
        self._required = config.auth == "required"
        self._metrics_public = config.metrics.public
        self._timeout = config.routing.decision_timeout_seconds
        admin = config.admin_key
        self._admin_hash = hash_key(admin) if admin else None

    async def start(self) -> None:
        """Follow key and auth-state events from the bus, then learn whether auth is on (and
        log it). An owner that does not answer yet leaves auth undecided: it is asked again
        on the first request that needs it."""
        self._watchers = [
            await follow(
                self._bus, subjects.AUTH_KEYS_CHANGED, self._on_event, name="auth-key-events"
            ),
            await follow(self._bus, subjects.AUTH_STATE, self._on_event, name="auth-state"),
        ]
        try:
            on = await self.auth_on()
        except GatewayError as err:
            logger.warning("auth: undecided until the key owner answers (%s)", err.message)
            return
        if on:
            logger.info(
                "auth: on (%s): /v1/* needs a gateway API key",
                "auth: required" if self._required else "a gateway API key exists",
            )
        else:
            logger.warning(
                "auth: OPEN - no gateway API key exists and auth is not 'required': "
                "/v1/* serves anonymous callers (role free)"
            )

    async def aclose(self) -> None:
        """Stop following key events."""
        watchers, self._watchers = self._watchers, []
        for watcher in watchers:
            await unfollow(watcher)
        checking, self._checking = self._checking, None
        if checking is not None and not checking.done():
            await unfollow(checking)

    async def auth_on(self) -> bool:
        """True with ``auth: required`` or once any key exists. Until one does, the owner is
        asked at most once per ``auth_cache_seconds`` (its AuthState event says it at once),
        and callers arriving while that question is out share its answer; once the owner
        has answered, that question only mends a lost event: a caller waits for it at most
        :data:`MEND_WAIT_S`, then goes on with what is known (a silent owner would cost each
        anonymous request the decision timeout twice, here and in routing). Raises the
        bus's GatewayError when the owner has never answered and cannot now."""
        if self._required or self._any_keys:
            return True
        now = self._clock()
        if self._any_keys is None or now - self._any_checked >= self._ttl:
            checking = self._checking
            if checking is None or checking.done():
                checking = self._checking = asyncio.get_running_loop().create_task(
                    self._check_auth_state(now)
                )
                checking.add_done_callback(_retrieved)
            if self._any_keys is None:
                # Shielded: a caller that goes away must not cancel the others' question.
                await asyncio.shield(checking)
            else:
                await asyncio.wait({checking}, timeout=MEND_WAIT_S)
        return bool(self._any_keys)

    async def _check_auth_state(self, now: float) -> None:
        try:
            reply = raise_for_reply(
                await self._bus.request(
                    subjects.AUTH_STATE_GET,
                    AuthStateRequest(),
                    reply_type=AuthState,
                    timeout=self._timeout,
                )
            )
        except GatewayError:
            if self._any_keys is None:
                raise
            logger.warning("auth: the key owner did not answer; auth stays off")
        else:
            self._any_keys = self._any_keys or reply.any_keys
        self._any_checked = now

    def forget(self, key_hash: str) -> None:
        """Drop ``key_hash`` from this ingress's cache (revoked or created elsewhere)."""
        self._cache.pop(key_hash, None)
        self._asking.pop(key_hash, None)

    def forget_key_id(self, key_id: str) -> None:
        """Drop the cached entry of the key whose id is ``key_id`` (revoked through the bus:
        the answer names the id, not the hash)."""
        for key_hash, (info, _) in list(self._cache.items()):
            if info.key_id == key_id:
                del self._cache[key_hash]
        self._asking.clear()  # an answer in flight may be this key's

    def key_created(self, key_hash: str) -> None:
        """A key was created: auth is on from now, and no stale "unknown" answer remains."""
        self._any_keys = True
        self.forget(key_hash)

    async def gate(self, req: HttpRequest) -> None:
        """Identify ``req``'s caller into its scope, enforcing the rules of its path."""
        path = req.scope["path"]
        if path.startswith("/v1/"):
            caller = await self.identify(req, strict=True)
            if caller is None:
                if await self.auth_on():
                    raise UnauthorizedError("missing API key: send Authorization: Bearer <key>")
                caller = ANONYMOUS
        elif path.startswith("/admin/"):
            caller = await self.identify(req, strict=True)
            if caller is None:
                raise UnauthorizedError("admin endpoints need an admin key")
            if not caller.is_admin:
                raise ForbiddenError("admin endpoints need an admin key")
        elif path in _KEYED or (path == METRICS and not self._metrics_public):
            caller = await self._introspecting(req, path)
            if caller is None:
                return
        else:
            caller = await self.identify(req, strict=False) if req.bearer_token() else None
            if caller is None:
                return
        req.scope[SCOPE_KEY] = caller

    async def _introspecting(self, req: HttpRequest, path: str) -> Caller | None:
        """The caller of an introspection path (None: anonymous, auth off). Raises
        UnauthorizedError without a usable key and ForbiddenError for ``/metrics`` below
        :data:`METRICS_ROLE`, when auth is on."""
        caller = await self.identify(req, strict=True)
        if not await self.auth_on():
            return caller
        if caller is None:
            raise UnauthorizedError("missing API key: send Authorization: Bearer <key>")
        if path == METRICS and role_rank(caller.role) < role_rank(METRICS_ROLE):
            raise ForbiddenError("/metrics needs an internal or admin key")
        return caller

    async def identify(self, req: HttpRequest, *, strict: bool) -> Caller | None:
        """The caller of ``req``'s key; None without a key (or, when not ``strict`` or auth is
        off, with an unknown one). ``strict``: an unusable key raises UnauthorizedError."""
        token = req.bearer_token()
        if token is None:
            return None
        return await self.identify_key(token, strict=strict)

    async def identify_key(self, token: str, *, strict: bool) -> Caller | None:
        """The caller of the key ``token`` (what :meth:`identify` does with a presented key;
        the dashboard's sign-in form presents one in its body)."""
        h = hash_key(token)
        if self._admin_hash is not None and hmac.compare_digest(h, self._admin_hash):
            # Not its hash: an operator-chosen key may be guessable from one.
            return BOOTSTRAP_ADMIN
        info = await self._lookup(h)
        status = info.status(time.time())
        if status == "active":
            return Caller(
                key_hash=h, role=info.role, key_id=info.key_id, org=info.org, user=info.user
            )
        if not strict or (not info.found and not await self.auth_on()):
            return None
        raise UnauthorizedError(
            {
                "unknown": "invalid API key",
                "expired": "API key expired",
                "revoked": "API key revoked",
            }[status]
        )

    async def admin_of_hash(self, key_hash: str) -> Caller | None:
        """The caller of the gateway API key whose sha256 is ``key_hash`` while that key is
        active and of role admin; None once it is revoked, expired, unknown or of another role.
        As cheap as the gate: the same cache, dropped at once by a revocation event. (A
        dashboard session checks its key with it on every request.)"""
        info = await self._lookup(key_hash)
        if info.role != "admin" or info.status(time.time()) != "active":
            return None
        return Caller(
            key_hash=key_hash, role=info.role, key_id=info.key_id, org=info.org, user=info.user
        )

    async def _lookup(self, key_hash: str) -> ApiKeyInfo:
        """The owner's answer for ``key_hash``, from the cache while it is fresh (unknown keys
        are cached too, so a stream of bad keys costs one bus request each per TTL), else
        from the lookup already asking for it (asked within :data:`JOIN_S`), else from a new
        one. Raises AuthBusyError when :data:`LOOKUPS_MAX` lookups are in flight, the bus's
        GatewayError."""
        now = self._clock()
        hit = self._cache.get(key_hash)
        if hit is not None and now - hit[1] < self._ttl:
            return hit[0]
        joined = self._asking.get(key_hash)
        if joined is not None and now - joined[1] <= JOIN_S:
            asking = joined[0]
        else:
            if self._outstanding >= LOOKUPS_MAX:
                # Fail fast, not queue: waiting would hold the flood's connections open, and
                # 401 would tell a caller whose valid key was not looked up that it is bad.
                raise AuthBusyError(
                    "too many API key lookups in flight on this gateway; retry shortly",
                    retry_after=_BUSY_RETRY_AFTER_S,
                )
            asking = asyncio.create_task(self._ask(key_hash), name="auth-key-lookup")
            asking.add_done_callback(_retrieve)  # its waiters may all have gone
            self._asking[key_hash] = (asking, now)
        # Shielded: a caller that goes away does not end the lookup the others wait on.
        return await asyncio.shield(asking)

    async def _ask(self, key_hash: str) -> ApiKeyInfo:
        self._outstanding += 1
        mine, asked_at = asyncio.current_task(), self._clock()
        try:
            info = raise_for_reply(
                await self._bus.request(
                    subjects.AUTH_KEYS_LOOKUP,
                    ApiKeyLookup(key_hash=key_hash),
                    reply_type=ApiKeyInfo,
                    timeout=self._timeout,
                )
            )
        finally:
            self._outstanding -= 1
            current = self._asking.get(key_hash, (None, 0.0))[0] is mine
            if current:
                del self._asking[key_hash]
        if current and self._ttl > 0:
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[key_hash] = (info, asked_at)
        return info

    async def _on_event(self, msg: object) -> None:
        match msg:
            case ApiKeyRevoked() as ev:
                self.forget(ev.key_hash)
            case ApiKeyCreated() as ev:
                self.key_created(ev.key_hash)
            case AuthState(any_keys=True):
                self._any_keys = True
            case AuthState() if self._any_keys is None:
                self._any_keys = False


def _retrieve(task: asyncio.Task[ApiKeyInfo]) -> None:
    if not task.cancelled():
        task.exception()  # marks a failure seen; each waiter got it raised already


async def follow(
    bus: Bus, subject: str, on_message: Callable[[object], Awaitable[None]], *, name: str
) -> asyncio.Task[None]:
    """A task feeding every message on ``subject`` to ``on_message``; returns once the
    subscription is live. Raises what ``Bus.subscribe`` raises."""
    ready = asyncio.Event()

    async def run() -> None:
        async with bus.subscribe(subject) as sub:
            ready.set()
            async for env in sub:
                try:
                    await on_message(env.message)
                except Exception:
                    logger.exception("handling a message on %s failed", subject)

    task = asyncio.create_task(run(), name=name)
    waiter = asyncio.create_task(ready.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        # Left running, it would fail alone once the bus closes, its error never retrieved.
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    finally:
        waiter.cancel()
    if task.done():
        task.result()  # raises why the subscription failed
        raise RuntimeError(f"subscription to {subject} ended at once")
    return task


async def unfollow(task: asyncio.Task[None] | None) -> None:
    """Stop a :func:`follow` task (None: nothing to stop) and wait until it has ended."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _retrieved(task: asyncio.Task[None]) -> None:
    """Mark a shared question's failure as seen: its waiters raise it, or none is left."""
    if not task.cancelled():
        task.exception()
