"""KeyPoolActor (one per pool, pool id = endpoint id) and the ``keys`` subtree.

Who owns what:

- KeyRegistryActor (``actors.keyregistry``) owns what the database declares about provider
  keys (database-added keys and reservations by hash) and the admin area ``provider_keys``
  that changes them; it publishes ``KeyDeclarations`` to every pool and ingress.
- KeyPoolActor owns one pool: its effective declaration (the route's configured keys, then
  the database keys that join it, each at the most restrictive ``min_role`` declared for that
  credential anywhere), its mutes and failure streaks, fed by the endpoint's observations. It
  publishes ``KeyPoolState`` on every change; ModelActors decide plans from that view (no bus
  round trip per request) and own the caller bindings those decisions make. ``acquire`` serves
  callers outside a plan with the pool's own bindings.
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from actors.base import Actor, ActorContext, Cancellable, Serve
from actors.child_spec import ChildSpec, Restart, Strategy
from actors.keyregistry import KeyRegistryActor, PoolRoute
from actors.state.backoff import ProbeBackoff, first_probe_after
from actors.state.keypool import KeyPool, declaration_of
from actors.state.route_table import candidate_for
from actors.supervisor import Supervisor
from bus import Envelope, NoRespondersError, RequestTimeoutError
from schemas import (
    QUOTA_EXHAUSTED,
    KeyAcquire,
    KeyCooling,
    KeyDeclarations,
    KeyDeclarationsRequest,
    KeyGrant,
    KeyMuted,
    KeyPoolState,
    KeyPoolStateRequest,
    KeyUnmuted,
    Observation,
    PoolKey,
    ProbeDue,
    ProbeResult,
    RouteCandidate,
    is_backpressure,
    subjects,
)
from schemas.config import GatewayConfig, KeyPoolConfig, credential_id
from schemas.keys import most_restrictive

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.stores.snapshots import SnapshotStore

logger = logging.getLogger(__name__)

_SEED_TIMEOUT = 1.0


@dataclass(frozen=True, slots=True)
class _Unmute:
    """Local timer message: a mute may have ended."""


@dataclass(frozen=True, slots=True)
class _ProbeDue:
    """Local timer message: a muted credential is due its background probe."""

    credential_id: str


class _Snapshot(msgspec.Struct):
    """Live mutes as saved: credential id -> (until, floor, period, backoff level), times on
    the actor's clock (wall-clock seconds)."""

    mutes: dict[str, tuple[float, float, float, int]] = {}


def effective_declaration(
    pool: str, base_url: str, configured: tuple[tuple[str, str], ...], decls: KeyDeclarations
) -> list[tuple[str, str, str]]:
    """(credential id, min_role, source) of every key of ``pool`` in declared order: the
    configured keys, then the database keys joining this pool in creation order; each at the
    most restrictive tier declared for its credential anywhere."""
    roles: dict[str, str] = dict(decls.reservations)
    for k in decls.db_keys:
        roles[k.credential_id] = most_restrictive(roles.get(k.credential_id), k.min_role)
    keys = [(cid, role, "config") for cid, role in configured]
    seen = {cid for cid, _ in configured}
    norm = base_url.rstrip("/")
    for k in decls.db_keys:
        joins = k.endpoint == pool or (bool(k.base_url) and k.base_url == norm)
        if joins and k.credential_id not in seen:
            seen.add(k.credential_id)
            keys.append((k.credential_id, k.min_role, "database"))
    declared = declaration_of([(cid, role) for cid, role, _ in keys], roles)
    return [(cid, role, src) for (cid, role), (_, _, src) in zip(declared, keys, strict=True)]


class KeyPoolActor(Actor):
    """Owns one pool's declaration, mutes and streaks. Publishes KeyPoolState on
    ``llmgw.keypool.<id>.state`` and KeyMuted/KeyUnmuted/KeyCooling on ``llmgw.events.keypool``;
    ``acquire`` answers KeyPoolExhaustedError / KeyPoolRoleRestrictedError as ErrorReply."""

    def __init__(
        self,
        pool: str,
        base_url: str,
        configured: tuple[tuple[str, str], ...],
        settings: KeyPoolConfig,
        *,
        probe: RouteCandidate | None = None,
        probe_first_seconds: float = 30.0,
        probe_after_fraction: float = 0.5,
        model: str = "",
        snapshots: SnapshotStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = f"keypool:{pool}"
        self.pool = pool
        self._base_url = base_url
        self._configured = configured
        self._settings = settings
        self._clock = clock
        self._probe = probe
        self._probe_first = probe_first_seconds  # the circuit cooldown
        self._probe_after = probe_after_fraction
        self._model = model
        self._snapshots = snapshots
        self.serves = (
            Serve(subjects.endpoint_probe_result(pool)),
            Serve(subjects.observation(pool)),
            Serve(subjects.keypool_get(pool)),
            Serve(subjects.keypool_acquire(pool)),
            Serve(subjects.KEYS_DECLARATIONS),
        )

    async def on_start(self, ctx: ActorContext) -> None:
        """Declare the configured keys, then fold what the registry holds."""
        self.ctx = ctx
        self._epoch = secrets.token_hex(4)
        self._seq = 0
        self._declarations = 0
        self._sources: dict[str, str] = {}
        self._keys = KeyPool(self.pool, self._settings)
        self._probes: dict[str, ProbeBackoff] = {}  # muted credential -> its probes' backoff
        self._probe_timers: dict[str, Cancellable] = {}
        self._declare(KeyDeclarations())
        try:
            reply = await ctx.bus.request(
                subjects.KEYS_REGISTRY_GET,
                KeyDeclarationsRequest(),
                reply_type=KeyDeclarations,
                timeout=_SEED_TIMEOUT,
            )
        except (NoRespondersError, RequestTimeoutError):
            reply = None
        if isinstance(reply, KeyDeclarations):
            self._declare(reply)
        self._saved: dict[str, tuple[float, float, float, int]] = {}
        await self._restore()
        await self._publish_state()

    async def on_stop(self) -> None:
        """Persist the mutes (they are saved on every change anyway)."""
        await self._save()

    async def _restore(self) -> None:
        """A restart keeps a muted key muted for what remains, and keeps probing it."""
        if self._snapshots is None:
            return
        snap = await self._snapshots.load_as(self.name, _Snapshot)
        if snap is None:
            return
        now = self._clock()
        for cid in self._keys.restore(snap.mutes, now):
            until = self._keys.muted_until(cid, now) or now
            logger.info("key %s of pool %s restored muted for %.1fs", cid, self.pool, until - now)
            self.ctx.call_later(until - now, _Unmute())
            self._start_probes(cid, now)
        self._saved = self._keys.durable(now)

    async def _save(self) -> None:
        if self._snapshots is None:
            return
        now = self._clock()
        durable = self._keys.durable(now)
        await self._snapshots.save(self.name, msgspec.json.encode(_Snapshot(mutes=durable)), now)
        self._saved = durable

    async def handle(self, env: Envelope) -> None:
        """Observations mute keys; declarations re-declare; get and acquire answer."""
        match env.message:
            case Observation() as obs:
                await self._observe(obs)
            case KeyDeclarations() as decls:
                dropped = self._declare(decls)
                if dropped is not None:
                    logger.info("key pool %s re-declared (%d bindings dropped)", self.pool, dropped)
                await self._publish_state()  # also unchanged: says this version is applied
            case KeyPoolStateRequest():
                await env.respond(self.state())
            case ProbeResult() as result:
                await self._probed(result)
            case KeyAcquire() as req:
                cid = self._keys.acquire(req.caller, req.role, self._clock())
                await env.respond(KeyGrant(pool=self.pool, credential_id=cid))

    async def handle_local(self, msg: object) -> None:
        """A mute's timers: its background probe, and every key back in rotation."""
        if isinstance(msg, _ProbeDue):
            cid = msg.credential_id
            self._probe_timers.pop(cid, None)
            now = self._clock()
            if self._probe is not None and self._keys.muted_until(cid, now):
                await self.ctx.publish(
                    subjects.PROBE_DUE,
                    ProbeDue(
                        endpoint=self.pool,
                        model=self._model,
                        candidate=self._probe,
                        credential_id=cid,
                    ),
                )
                self._schedule_probe(cid, now)
        elif isinstance(msg, _Unmute):
            back = self._keys.expire(self._clock())
            if not back:
                return
            for cid in back:
                self._stop_probes(cid)
            # State first: whoever reacts to the event finds the views already updated.
            await self._publish_state()
            for cid in back:
                logger.info("key %s of pool %s is back in rotation", cid, self.pool)
                await self.ctx.publish(
                    subjects.event("keypool"), KeyUnmuted(pool=self.pool, credential_id=cid)
                )

    def state(self) -> KeyPoolState:
        """This pool as views see it."""
        now = self._clock()
        return KeyPoolState(
            pool=self.pool,
            keys=tuple(
                PoolKey(
                    credential_id=cid,
                    min_role=role,
                    muted_until=self._keys.muted_until(cid, now),
                    source=self._sources.get(cid, "config"),
                )
                for cid, role in self._keys.declared
            ),
            epoch=self._epoch,
            seq=self._seq,
            declarations=self._declarations,
            cooling=self._keys.cooling.live(now),
        )

    def _declare(self, decls: KeyDeclarations) -> int | None:
        """Apply the effective declaration; None when nothing changed."""
        self._declarations = decls.seq
        keys = effective_declaration(self.pool, self._base_url, self._configured, decls)
        self._sources = {cid: src for cid, _, src in keys}
        new = tuple((cid, role) for cid, role, _ in keys)
        if new == self._keys.declared:
            return None
        return self._keys.declare(new)

    async def _observe(self, obs: Observation) -> None:
        now = self._clock()
        cid = obs.credential_id
        if is_backpressure(obs):
            await self._rate_limited(cid, now, obs.retry_after)
            return
        if not cid:
            if obs.outcome == "success":
                self._keys.cooling.succeeded(cid)
            return
        was_muted = self._keys.muted_until(cid, now) is not None
        until = self._keys.record(
            cid,
            status=obs.status,
            outcome=obs.outcome,
            role=obs.role,
            now=now,
            retry_after=obs.retry_after,
            quota=obs.error_kind == QUOTA_EXHAUSTED,
            kind=obs.error_kind,
        )
        if until is None:
            return
        logger.warning(
            "key %s of pool %s muted for %.1fs (status %s)", cid, self.pool, until - now, obs.status
        )
        self.ctx.call_later(max(0.0, until - now), _Unmute())
        if was_muted:
            self._schedule_probe(cid, now)
        else:
            self._start_probes(cid, now)
        await self._publish_state()  # before the event: see handle_local
        await self.ctx.publish(
            subjects.event("keypool"),
            KeyMuted(
                pool=self.pool,
                credential_id=obs.credential_id,
                until=until,
                seconds=until - now,
                status=obs.status,
                reason=obs.error_kind,
            ),
        )

    async def _rate_limited(self, cid: str, now: float, retry_after: float | None) -> None:
        """A provider's 429: the credential cools (no mute, no probe: it comes back by
        itself); the views learn it at once, then the event says so."""
        until = self._keys.rate_limited(cid, now, retry_after)
        if until is None:
            return
        logger.info(
            "key %s of pool %s cooling for %.1fs (rate limited%s)",
            cid or "-",
            self.pool,
            until - now,
            ", as the provider asked" if retry_after else "",
        )
        await self._publish_state()
        await self.ctx.publish(
            subjects.event("keypool"),
            KeyCooling(
                pool=self.pool,
                credential_id=cid,
                until=until,
                seconds=until - now,
                hinted=bool(retry_after),
                ts=now,
            ),
        )

    def _start_probes(self, cid: str, now: float) -> None:
        """Re-validate a new mute first after the circuit cooldown, then with backoff (a
        caller's only key too: while it is muted no traffic would retry it)."""
        self._stop_probes(cid)
        self._probes[cid] = ProbeBackoff(
            first_probe_after(self._probe_first, self._probe_after, self._keys.mute_period(cid))
        )
        self._schedule_probe(cid, now)

    def _schedule_probe(self, cid: str, now: float) -> None:
        probes = self._probes.get(cid)
        if cid in self._probe_timers or probes is None:
            return  # its next probe is already due (or it is not muted)
        delay = probes.next_delay(now, self._keys.muted_until(cid, now))
        if delay is not None:
            self._probe_timers[cid] = self.ctx.call_later(delay, _ProbeDue(cid))

    def _stop_probes(self, cid: str) -> None:
        timer = self._probe_timers.pop(cid, None)
        if timer is not None:
            timer.cancel()
        self._probes.pop(cid, None)

    async def _probed(self, result: ProbeResult) -> None:
        """A probe through this pool: a success lifts the mute of the credential it used
        (never before a provider's Retry-After; an admin's lift names none and lifts every
        key), a failure mutes that credential for another full period."""
        now = self._clock()
        cid = result.credential_id
        if result.ok:
            if cid:
                lifted = [cid] if self._keys.lift(cid, now) is not None else []
            else:
                lifted = self._keys.lift_all(now)
            for key in lifted:
                logger.info(
                    "key %s of pool %s is re-validated (%s)",
                    key,
                    self.pool,
                    result.detail or "probe succeeded",
                )
                self._stop_probes(key)
            if lifted:
                # A provider's Retry-After may hold a key a while longer: unmute it then.
                back = max((self._keys.muted_until(k, now) or now) for k in lifted)
                self.ctx.call_later(max(0.0, back - now), _Unmute())
                await self._publish_state()
            return
        if not cid or self._keys.muted_until(cid, now) is None:
            return
        until = self._keys.remute(cid, now)
        logger.warning("key %s of pool %s failed its probe: %s", cid, self.pool, result.detail)
        self.ctx.call_later(until - now, _Unmute())
        self._schedule_probe(cid, now)
        await self._publish_state()
        await self.ctx.publish(
            subjects.event("keypool"),
            KeyMuted(
                pool=self.pool,
                credential_id=cid,
                until=until,
                seconds=until - now,
                status=None,
                reason="probe failed",
            ),
        )

    async def _publish_state(self) -> None:
        # Views first, the write after: routing must not wait on the disk to see a mute.
        self._seq += 1
        await self.ctx.publish(subjects.keypool_state(self.pool), self.state())
        if self._snapshots is not None and self._keys.durable(self._clock()) != self._saved:
            await self._save()


def config_roles(config: GatewayConfig) -> dict[str, str]:
    """The most restrictive configured ``min_role`` of each credential, across all routes."""
    roles: dict[str, str] = {}
    for model in config.models:
        for route in model.route:
            for secret, role in route.key_declarations:
                cid = credential_id(secret)
                roles[cid] = most_restrictive(roles.get(cid), role)
    return {cid: role for cid, role in roles.items() if role != "free"}


def keys_supervisor(
    config: GatewayConfig,
    *,
    clock: Callable[[], float] | None = None,
    snapshots: SnapshotStore | None = None,
    shared_url: str | None = None,
) -> Supervisor:
    """The ``keys`` subtree: the registry, then one KeyPoolActor per endpoint. A pool's spec
    holds only what its declaration depends on, so a config reload that changes a route's
    weight (say) keeps the pool and its mutes. ``shared_url``: the registry keeps the
    database-added keys in that PostgreSQL database (a cluster) instead of the SQLite file."""
    roles = tuple(sorted(config_roles(config).items()))
    pools = tuple(
        PoolRoute(eid, route.base_url, route.credential_ids)
        for model in config.models
        for eid, route in zip(model.endpoint_ids(), model.route, strict=True)
    )
    extra = {"clock": clock} if clock is not None else {}
    settings = config.routing.key_pool
    children: list[ChildSpec | Supervisor] = [
        ChildSpec(
            "keys:registry",
            functools.partial(
                KeyRegistryActor, config.database.path, roles, pools, shared_url=shared_url
            ),
        ),
    ]
    for model in config.models:
        for eid, route in zip(model.endpoint_ids(), model.route, strict=True):
            configured = tuple((credential_id(s), r) for s, r in route.key_declarations)
            children.append(
                ChildSpec(
                    f"keypool:{eid}",
                    functools.partial(
                        KeyPoolActor,
                        eid,
                        route.base_url,
                        configured,
                        settings,
                        probe=candidate_for(eid, route),
                        model=model.id,
                        probe_first_seconds=config.routing.circuit.cooldown_seconds,
                        probe_after_fraction=config.routing.bench.probe_after_fraction,
                        snapshots=snapshots,
                        **extra,
                    ),
                    restart=Restart.PERMANENT,
                )
            )
    return Supervisor(
        "keys", strategy=Strategy.ONE_FOR_ONE, intensity=10, period=5.0, children=children
    )
