"""One config replayed: the real actor tree and the real ingress on the in-process bus,
driven as an ASGI app at the trace's virtual arrival times, against the simulated adapter.

Nothing routes differently for the replay: the actors are :func:`actors.build_tree`'s, the
requests go through ``GatewayApp`` (decode, steering and rules, the plan, the failover loop
with hedging, the relay), only the clocks, the random sources and the adapters are the
replay's. It must run on a :class:`~gateway.replay.vloop.VirtualTimeLoop`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from pathlib import Path
from random import Random
from typing import TYPE_CHECKING, Any

from actors import build_tree
from bus import InProcessBus
from gateway.http.lifespan import Lifespan
from gateway.ingress.app import GatewayApp
from gateway.ingress.clock import IngressClock
from gateway.ingress.plan_walk import Targets
from gateway.ingress.settling import LeaseKeeper
from gateway.process.prober import BenchProber
from gateway.process.routewise_prober import RouteWiseProber
from gateway.replay.callers import create_keys, declared_keys
from gateway.replay.outcome import Outcome, RunResult, Transition
from gateway.replay.requests import request_body, request_scope
from gateway.replay.simulated import SimulatedAdapter
from gateway.replay.vloop import VirtualTimeLoop
from schemas import (
    BenchChanged,
    CircuitTransition,
    KeyMuted,
    KeyUnmuted,
    ModeChanged,
    Observation,
    subjects,
)

if TYPE_CHECKING:
    from collections.abc import Callable, MutableMapping, Sequence

    from bus import Envelope
    from gateway.adapters.base import Adapter
    from gateway.replay.providers import ProvidersFile
    from gateway.replay.trace import TraceKey, TraceRequest
    from schemas.config import GatewayConfig

WALL_EPOCH = 1_800_000_000.0
"""Unix time of virtual second 0: fixed, so a replay never depends on today's date."""

_SIMULATED_KINDS = ("openai_compat", "anthropic", "bedrock")
_FOREVER = 1e12


async def replay_config(
    name: str,
    config: GatewayConfig,
    trace: Sequence[TraceRequest],
    providers: ProvidersFile,
    *,
    seed: int,
    keys: Sequence[TraceKey] = (),
    progress: Callable[[int], None] | None = None,
) -> RunResult:
    """Replay ``trace`` through a fresh gateway for ``config``, its gateway API keys
    (``keys``, and any other a request names) created first; ``progress`` is called with
    the number of requests finished so far. Raises RuntimeError when not on a
    VirtualTimeLoop, or when thread work ran while virtual time jumped (not repeatable)."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, VirtualTimeLoop):
        raise RuntimeError("a replay runs on a VirtualTimeLoop (gateway.replay.vloop)")
    with tempfile.TemporaryDirectory(prefix="llmgw-replay-") as tmp:
        isolated = config.model_copy(
            update={
                "database": config.database.model_copy(update={"path": str(Path(tmp) / "db")}),
                "log": config.log.model_copy(update={"enabled": False}),
                # Whether any gateway key exists, and each key, is asked of its owner
                # (SQLite, a thread) once before the traffic, not again while virtual
                # time jumps; the limits' counters are saved when the replay stops.
                "auth_cache_seconds": _FOREVER,
                "limits": config.limits.model_copy(update={"snapshot_seconds": _FOREVER}),
            }
        )
        run = _Run(name, isolated, providers, seed, loop)
        return await run.run(trace, declared_keys(keys, trace), progress)


class _Run:
    """The pieces of one replay and what it collects."""

    def __init__(
        self,
        name: str,
        config: GatewayConfig,
        providers: ProvidersFile,
        seed: int,
        loop: VirtualTimeLoop,
    ) -> None:
        self.name = name
        self.config = config
        self.loop = loop
        self.seed = seed
        self.bus = InProcessBus()
        self.sim = SimulatedAdapter(providers, seed, loop.time, loop.time())
        self.obs: dict[str, list[Observation]] = {}
        self.transitions: list[Transition] = []
        self.outcomes: list[Outcome] = []

    def wall(self) -> float:
        return WALL_EPOCH + self.loop.time() - self.sim.origin

    def since_start(self) -> float:
        return round(self.loop.time() - self.sim.origin, 6)

    async def run(
        self,
        trace: Sequence[TraceRequest],
        keys: Sequence[TraceKey],
        progress: Callable[[int], None] | None,
    ) -> RunResult:
        loop = self.loop
        # Starting opens SQLite (a thread): real waits until the gateway is up.
        loop.jumping = False
        root = build_tree(self.config, clock=self.wall, seed=self.seed)
        await root.start(self.bus)
        # Before the ingress starts, so its views load them (the limits, whether auth is on).
        secrets = await create_keys(self.bus, keys)
        clock = IngressClock(steady=loop.time, wall=self.wall)
        app = GatewayApp(
            self.bus,
            self.config,
            clock=clock,
            adapters=dict.fromkeys(_SIMULATED_KINDS, self.sim),
            rng=Random(f"{self.seed}:steering"),
        )
        lifespan = Lifespan(app)
        await lifespan.startup()
        for secret in secrets.values():  # each key's lookup answered before the traffic
            await app.callers.auth.identify_key(secret, strict=True)
        await app.callers.auth.auth_on()
        prober_leases = LeaseKeeper(
            self.bus, self.config.routing.leases.ttl_seconds, "prober", clock=clock.steady
        )
        listeners = [
            asyncio.create_task(self._follow(subjects.OBSERVATION_ANY)),
            asyncio.create_task(self._follow(subjects.EVENTS_ANY)),
            *self._probers(app, clock, prober_leases),
        ]
        await asyncio.sleep(0)  # the listeners subscribe before the first request
        try:
            wakeups = loop.thread_wakeups
            loop.jumping = True
            self.sim.origin = loop.time()
            await self._feed(app, trace, secrets, progress)
            await asyncio.sleep(1.0)  # the last observations and events arrive
            if loop.thread_wakeups != wakeups:
                raise RuntimeError(
                    "thread work ran during the replay: its timing is not repeatable"
                )
            duration = self.since_start()
        finally:
            loop.jumping = False
            for task in listeners:
                task.cancel()
            await asyncio.gather(*listeners, return_exceptions=True)
            await prober_leases.aclose()
            # The actors first: the limits' owner saves its counters as it stops, which
            # acknowledges the settles the ingress waits for (virtual timers stand still
            # now, so a wait for them would never end).
            await root.stop()
            await lifespan.shutdown()
            await self.bus.aclose()
        return RunResult(
            name=self.name,
            config=self.config,
            outcomes=sorted(self.outcomes, key=lambda o: (o.t, o.id)),
            observations=self.obs,
            transitions=self.transitions,
            billed={e: dataclasses.astuple(b) for e, b in sorted(self.sim.billed.items())},
            probes={e: dataclasses.astuple(b) for e, b in sorted(self.sim.probes.items())},
            duration=duration,
        )

    def _probers(
        self, app: GatewayApp, clock: IngressClock, leases: LeaseKeeper
    ) -> list[asyncio.Task[None]]:
        """The bench and RouteWise probers a serving process runs beside the actors
        (gateway.process.sidecars), on the simulated routes."""
        adapters: dict[str, Adapter] = dict.fromkeys(_SIMULATED_KINDS, self.sim.for_probes())
        secrets = app.callers.secrets
        targets = Targets(self.config, secrets)
        return [
            asyncio.create_task(prober.run())
            for prober in (
                BenchProber(self.bus, adapters, targets, leases, secrets, clock=clock),
                RouteWiseProber(self.bus, adapters, targets, leases, secrets, clock=clock),
            )
        ]

    async def _feed(
        self,
        app: GatewayApp,
        trace: Sequence[TraceRequest],
        secrets: dict[str, str],
        progress: Callable[[int], None] | None,
    ) -> None:
        """Send each request at its arrival time, with its key's secret; return when all
        have been answered."""
        done = 0

        async def one(r: TraceRequest) -> None:
            nonlocal done
            self.outcomes.append(await self._send(app, r, secrets.get(r.key)))
            done += 1
            if progress is not None:
                progress(done)

        async with asyncio.TaskGroup() as tg:
            for r in trace:
                delay = self.sim.origin + r.t - self.loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                tg.create_task(one(r))

    async def _send(self, app: GatewayApp, r: TraceRequest, secret: str | None) -> Outcome:
        """One trace request through the ASGI app, as its client sees it."""
        arrived = self.loop.time()
        exchange = _Exchange(self.loop, request_body(r))
        await app(request_scope(r, secret), exchange.receive, exchange.send)
        exchange.finished.set()
        return exchange.outcome(r, arrived, self.sim.origin)

    async def _follow(self, subject: str) -> None:
        async with self.bus.subscribe(subject) as sub:
            async for env in sub:
                self._collect(env)

    def _collect(self, env: Envelope) -> None:
        msg = env.message
        at = self.since_start()
        match msg:
            case Observation():
                self.obs.setdefault(msg.request_id, []).append(msg)
            case CircuitTransition():
                self.transitions.append(Transition(at, "circuit", msg.endpoint, msg.new))
            case BenchChanged():
                state = "benched" if msg.benched else "unbenched"
                self.transitions.append(Transition(at, "bench", msg.endpoint, state))
            case ModeChanged():
                self.transitions.append(Transition(at, "mode", "", msg.mode))
            case KeyMuted():  # a credential's cooldown on one route
                self.transitions.append(Transition(at, "key", msg.pool, "muted"))
            case KeyUnmuted():
                self.transitions.append(Transition(at, "key", msg.pool, "unmuted"))
            case _:
                pass


class _Exchange:
    """One ASGI request/response: the body in, the status, headers and body out, timed."""

    def __init__(self, loop: asyncio.AbstractEventLoop, body: bytes) -> None:
        self._loop = loop
        self._body: bytes | None = body
        self.finished = asyncio.Event()
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.first_byte: float | None = None
        self.tail = b""

    async def receive(self) -> MutableMapping[str, Any]:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.finished.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = dict(message.get("headers") or ())
        elif message["type"] == "http.response.body":
            data = message.get("body") or b""
            if data and self.first_byte is None:
                self.first_byte = self._loop.time()
            if data:
                self.tail = data
            if not message.get("more_body", False):
                self.finished.set()

    def outcome(self, r: TraceRequest, arrived: float, origin: float) -> Outcome:
        broken = r.stream and self.status == 200 and not self.tail.rstrip().endswith(b"[DONE]")
        ok = self.status == 200 and not broken
        return Outcome(
            id=r.id,
            t=r.t,
            request_id=self.headers.get(b"x-request-id", b"").decode(),
            status=self.status,
            served=ok,
            broken=broken,
            endpoint=self.headers.get(b"x-routed-via", b"").decode() if ok else "",
            ttft=(self.first_byte - arrived) if ok and self.first_byte is not None else None,
            at=arrived - origin,
        )
