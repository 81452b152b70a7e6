"""Helpers shared by the end-to-end tests: config builders and bus watchers.

Every e2e test drives the real gateway over loopback HTTP against fake upstreams that are
real servers; it waits on events (upstream requests, the gateway's own bus), never on sleeps.
"""

from __future__ import annotations

import asyncio
import functools
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio
import pytest

import gateway.process.actor_host
from actors import build_tree
from gateway.process.engines import ENGINES
from schemas import CircuitTransition, EndpointState, ModelStatus, ModelStatusRequest, subjects
from tests.fixtures.nats import start_nats_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator, Mapping
    from pathlib import Path

    from bus import Bus, Subscription
    from tests.fixtures.gateway import GatewayProcess, RunningGateway
    from tests.fixtures.upstream import FakeUpstream

T = TypeVar("T")

ONE_BUS = pytest.mark.parametrize("bus_url", ["inproc"], indirect=True)
"""For a module whose subject is what one request's bytes become on their way through (a
surface's or a platform's translation, an upstream's malformed answer): its tests run on the
in-process bus only. That bus encodes and decodes every message with NATS's codec, and what
NATS adds (transport, reconnects, queue groups, payload limits) is proven by the bus contract
suite and by every test of state, admin, limits, events and failover, which run on both."""

WAIT = 10.0  # seconds a test waits for an event before it fails
PROCESS_WAIT = 30.0  # seconds a CLI child may take: Python starting on a loaded machine
CHAT = "/v1/chat/completions"
HI: list[Any] = [{"role": "user", "content": "hi"}]
# Breaker timings. A probe's deadline is the route's own timeout plus one cooldown, so a probe
# is ended by its answer, its client or the route's timeout; a test that needs the circuit to
# stay open must give it a cooldown that a loaded machine never reaches.
FAST_CIRCUIT = {"failure_threshold": 2, "cooldown_seconds": 0.3}
HALF_OPEN_SOON = {"failure_threshold": 2, "cooldown_seconds": 1.0}
STAYS_OPEN = {"failure_threshold": 2, "cooldown_seconds": 30}


def route(up: FakeUpstream, weight: float = 1.0, **extra: Any) -> dict[str, Any]:
    """An ``openai_compat`` route to fake upstream ``up``."""
    return {
        "kind": "openai_compat",
        "base_url": up.openai_base_url,
        "weight": weight,
        "provider_model_id": f"{up.name}-model",
        **extra,
    }


def anthropic_route(up: FakeUpstream, weight: float = 1.0, **extra: Any) -> dict[str, Any]:
    """An ``anthropic`` route to fake upstream ``up``."""
    return {
        "kind": "anthropic",
        "base_url": up.anthropic_base_url,
        "weight": weight,
        "provider_model_id": f"{up.name}-model",
        **extra,
    }


def model(model_id: str, *routes: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One model entry."""
    return {"id": model_id, "route": list(routes), **extra}


def config(
    *models: dict[str, Any],
    circuit: dict[str, Any] | None = None,
    routing: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A whole gateway config (breaker timings default to :data:`FAST_CIRCUIT`; ``routing``
    adds other keys of the ``routing:`` section)."""
    section = {"circuit": circuit or FAST_CIRCUIT, **(routing or {})}
    return {"routing": section, "models": list(models), **extra}


def eid(model_id: str, up: FakeUpstream) -> str:
    """The endpoint id the gateway derives for ``up`` serving ``model_id``."""
    return f"{model_id}:local-{up.port}"


def chat(model_id: str = "m", **extra: Any) -> dict[str, Any]:
    """A minimal chat completions request body."""
    return {"model": model_id, "messages": HI, **extra}


class _Response(Protocol):
    """What an error check reads of an answer (httpx's, or the one an SDK error carries)."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def text(self) -> str: ...
    def json(self) -> Any: ...


def assert_openai_error(resp: _Response, status: int, code: str | None = None) -> dict[str, Any]:
    """``resp`` is an OpenAI-shaped error answer with ``status``; returns its ``error``."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert isinstance(err["code"], str) and err["code"], err
    assert "Traceback" not in resp.text
    if code is not None:
        assert err["code"] == code, err
    return dict(err)


class Watch:
    """A subscription on a gateway's bus; ``next`` awaits the first matching message not yet
    taken, so waiting for two events works whichever arrives first."""

    def __init__(self, sub: Subscription) -> None:
        self._sub = sub
        self.seen: list[Any] = []  # every message received, in arrival order
        self._backlog: list[Any] = []  # received but not yet taken by ``next``

    async def next(
        self, kind: type[T], where: Callable[[T], bool] = lambda _: True, timeout: float = WAIT
    ) -> T:
        """The first untaken message of type ``kind`` satisfying ``where``. Raises
        TimeoutError."""
        for i, msg in enumerate(self._backlog):
            if isinstance(msg, kind) and where(msg):
                del self._backlog[i]
                return msg
        with anyio.fail_after(timeout):
            async for env in self._sub:
                msg = env.message
                self.seen.append(msg)
                if isinstance(msg, kind) and where(msg):
                    return msg
                self._backlog.append(msg)
        raise AssertionError(f"subscription {self._sub.subject} ended")

    async def state(self, where: Callable[[EndpointState], bool]) -> EndpointState:
        """The next EndpointState satisfying ``where``."""
        return await self.next(EndpointState, where)

    async def circuit(self, new: str, endpoint: str | None = None) -> CircuitTransition:
        """The next CircuitTransition into ``new`` (of ``endpoint``, when given)."""
        return await self.next(
            CircuitTransition,
            lambda t: t.new == new and (endpoint is None or t.endpoint == endpoint),
        )


def gateway_bus(gw: RunningGateway) -> Bus:
    """The bus ``gw`` serves on."""
    assert gw.bus is not None, "the gateway fixture did not record its bus"
    return gw.bus


async def model_status(gw: RunningGateway, model_id: str = "m") -> ModelStatus:
    """What ``model_id``'s ModelActor says of its routes (``llmgw.model.<id>.status``)."""
    reply = await gateway_bus(gw).request(
        subjects.model_status(model_id), ModelStatusRequest(), reply_type=ModelStatus, timeout=WAIT
    )
    assert isinstance(reply, ModelStatus), reply
    return reply


async def settled_in_flight(gw: RunningGateway, model_id: str = "m") -> dict[str, int]:
    """Each route's requests in flight once none is left (or as they stand after ``WAIT``):
    a bounded loop of awaited status requests, since nothing publishes the count."""
    counted = {r.endpoint: r.in_flight for r in (await model_status(gw, model_id)).routes}
    with anyio.move_on_after(WAIT):
        while any(counted.values()):
            counted = {r.endpoint: r.in_flight for r in (await model_status(gw, model_id)).routes}
    return counted


@asynccontextmanager
async def watch(gw: RunningGateway, subject: str) -> AsyncIterator[Watch]:
    """Subscribe to ``subject`` on ``gw``'s bus for the ``async with`` block."""
    async with gateway_bus(gw).subscribe(subject) as sub:
        yield Watch(sub)


def circuit_events(gw: RunningGateway) -> Any:
    """Watch ``llmgw.events.circuit`` on ``gw``'s bus."""
    return watch(gw, subjects.event("circuit"))


def endpoint_states(gw: RunningGateway, endpoint: str) -> Any:
    """Watch ``llmgw.endpoint.<endpoint>.state`` on ``gw``'s bus."""
    return watch(gw, subjects.endpoint_state(endpoint))


class SkewedClock:
    """The actors' injectable clock: wall-clock time plus an offset a test moves forward, so
    TTLs and expiries pass at once while timers and everything else keep real time."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        """Jump the actors' clock ``seconds`` ahead."""
        self.offset += seconds


@pytest.fixture
def actor_clock(monkeypatch: pytest.MonkeyPatch) -> SkewedClock:
    """Every gateway this test starts in-process runs its actors on the returned clock."""
    clock = SkewedClock()
    skewed = functools.partial(build_tree, clock=clock)
    monkeypatch.setattr(gateway.process.actor_host, "build_tree", skewed)
    return clock


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[str]:
    """A NATS server of this test's own (no other test's hosts in its buckets); requested
    before ``processes`` so the processes stop before it does."""
    with start_nats_server(tmp_path / "nats") as url:
        yield url


@pytest.fixture
async def processes() -> AsyncIterator[list[GatewayProcess]]:
    """Gateway processes a test started; all stopped (in reverse) when it ends."""
    started: list[GatewayProcess] = []
    yield started
    for proc in reversed(started):
        await asyncio.to_thread(proc.stop)


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """Every HTTP engine (``server.engine``) in turn: the framing tests run on each (a test
    that applies to fewer overrides it with ``parametrize(..., indirect=True)`` and says why)."""
    return str(request.param)
