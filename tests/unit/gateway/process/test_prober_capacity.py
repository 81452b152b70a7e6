"""The bench prober on a capacity route: its probe takes a lease like any request, is skipped
while the pool is full, and gives the lease back when it ends (a real fake upstream)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors import ChildSpec, Supervisor
from actors.capacity import CapacityActor
from bus import InProcessBus
from gateway.adapters.registry import make_adapters, make_http_client
from gateway.ingress.plan_walk import Targets
from gateway.ingress.settling import LeaseKeeper
from gateway.process.prober import BenchProber
from schemas import CapacityGet, CapacityState, ProbeDue, RouteCandidate, subjects
from schemas.capacity import PoolSpec
from schemas.config import GatewayConfig, LeaseConfig

if TYPE_CHECKING:
    from tests.fixtures.upstream import FakeUpstream

WAIT = 5.0


async def test_a_probe_of_a_full_concurrency_route_waits_for_a_free_slot(
    fake_upstream: FakeUpstream,
) -> None:
    bus = InProcessBus()
    ep = "m:slots"
    spec = PoolSpec("slots", "concurrency", 1.0, None, (ep,))
    root = Supervisor("t", children=[ChildSpec("cap", lambda: CapacityActor(spec, LeaseConfig()))])
    await root.start(bus)
    client = make_http_client()
    prober = BenchProber(
        bus, make_adapters(client), Targets(GatewayConfig()), LeaseKeeper(bus, 30.0, "prober")
    )
    other = LeaseKeeper(bus, 30.0, "ingress")
    candidate = RouteCandidate(
        endpoint=ep,
        kind="openai_compat",
        pool="slots",
        base_url=fake_upstream.openai_base_url,
        upstream_model="x",
    )
    due = ProbeDue(endpoint=ep, model="m", candidate=candidate)
    try:
        taken = await other.acquire(candidate, "busy")
        assert taken is not None
        assert await prober.handle(due) is None  # skipped: the one slot is taken
        assert fake_upstream.requests == []
        await other.release(taken)
        result = await prober.handle(due)
        assert result is not None and result.ok
        assert len(fake_upstream.requests) == 1
        state = await bus.request(
            subjects.capacity_get("slots"),
            CapacityGet(pool="slots"),
            reply_type=CapacityState,
            timeout=WAIT,
        )
        assert isinstance(state, CapacityState) and state.used == 0  # given back
    finally:
        await other.aclose()
        await client.aclose()
        await root.stop()
        await bus.aclose()
