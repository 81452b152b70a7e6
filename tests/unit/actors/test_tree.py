"""build_tree(config) on the in-process bus: what it starts, in which order, and that a crashed
actor is restarted and serving again with its view rebuilt from the owners."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from actors import Actor, EndpointActor, ModelActor, Supervisor, build_tree
from bus import InProcessBus
from schemas import (
    ChildRestarted,
    ChildStarted,
    CircuitTransition,
    EndpointState,
    HealthReport,
    HealthRequest,
    ModelStatus,
    ModelStatusRequest,
    Observation,
    RoutePlan,
    RouteRequest,
    StateRequest,
    subjects,
)
from schemas.config import GatewayConfig
from tests.unit.actors import WAIT, next_event

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

A, B = "m:local-8001", "m:local-8002"
CONFIG = GatewayConfig.model_validate(
    {
        "routing": {
            "circuit": {"failure_threshold": 1, "cooldown_seconds": 300},
            "affinity": {"enabled": False},
        },
        "models": [
            {
                "id": "m",
                "route": [
                    {"kind": "openai_compat", "base_url": "http://127.0.0.1:8001/v1"},
                    {"kind": "openai_compat", "base_url": "http://127.0.0.1:8002/v1"},
                ],
            },
            {"id": "demo", "route": [{"kind": "echo"}]},
        ],
    }
)


@pytest.fixture
async def bus() -> AsyncIterator[InProcessBus]:
    b = InProcessBus()
    yield b
    await b.aclose()


@pytest.fixture
async def tree(bus: InProcessBus) -> AsyncIterator[Supervisor]:
    root = build_tree(CONFIG)
    await root.start(bus)
    yield root
    await root.stop()


def child(root: Supervisor, group: str, name: str) -> Actor:
    sup = root.child(group)
    assert isinstance(sup, Supervisor)
    actor = sup.child(name)
    assert isinstance(actor, Actor)
    return actor


def crash(actor: Actor) -> None:
    """Make ``actor`` crash the way any unexpected bug would: an exception in its own task."""

    async def boom() -> None:
        raise RuntimeError(f"injected crash of {actor.name}")

    actor.ctx.start_soon(boom)


async def plan(bus: InProcessBus, model: str = "m") -> RoutePlan:
    reply = await bus.request(
        subjects.model_route(model), RouteRequest(model=model), reply_type=RoutePlan, timeout=WAIT
    )
    assert isinstance(reply, RoutePlan), reply
    return reply


async def open_a(bus: InProcessBus) -> None:
    """Open A's circuit through its owner, and wait until the model's view has it."""
    async with bus.subscribe(subjects.event("circuit")) as events:
        await bus.publish(
            subjects.observation(A),
            Observation(endpoint=A, model="m", outcome="failure", status=500),
        )
        opened = await next_event(events, CircuitTransition)
    assert (opened.endpoint, opened.new) == (A, "open")
    for _ in range(100):  # no event says the model folded it in: bounded status requests
        st = await bus.request(
            subjects.model_status("m"), ModelStatusRequest(), reply_type=ModelStatus, timeout=WAIT
        )
        assert isinstance(st, ModelStatus)
        if st.routes[0].circuit_state == "open":
            return
    raise AssertionError("the model never saw A open")


async def test_tree_starts_endpoints_before_models_and_health_and_serves(
    bus: InProcessBus,
) -> None:
    root = build_tree(CONFIG)
    async with bus.subscribe(subjects.supervisor_event("root")) as events:
        await root.start(bus)
        try:
            started: list[str] = []
            while "health" not in started:
                started.append((await next_event(events, ChildStarted)).child)
            models = {m: (await plan(bus, m)).candidates[0].endpoint for m in ("m", "demo")}
            endpoint_a = child(root, "endpoints", f"endpoint:{A}")
        finally:
            await root.stop()

    # Endpoints first, so the models and the health view can seed their views from them.
    assert started.index("endpoints") < started.index("models") < started.index("health")
    assert models["m"] in (A, B) and models["demo"] == "demo:echo"
    assert isinstance(endpoint_a, EndpointActor)


async def test_tree_restarts_a_crashed_model_actor_which_reseeds_its_view(
    bus: InProcessBus,
    tree: Supervisor,
) -> None:
    await open_a(bus)
    before = child(tree, "models", "model:m")

    async with bus.subscribe(subjects.supervisor_event("models")) as events:
        crash(before)
        restarted = await next_event(events, ChildRestarted, "model:m")
    plans = [await plan(bus) for _ in range(20)]

    after = child(tree, "models", "model:m")
    assert isinstance(after, ModelActor) and after is not before
    assert restarted.restarts == 1
    # The new instance asked the endpoints' owners: A is still open, so only B serves.
    assert {tuple(c.endpoint for c in p.candidates) for p in plans} == {(B,)}


async def test_tree_restarts_a_crashed_endpoint_actor_which_serves_again(
    bus: InProcessBus,
    tree: Supervisor,
) -> None:
    before = child(tree, "endpoints", f"endpoint:{B}")

    async with (
        bus.subscribe(subjects.supervisor_event("endpoints")) as events,
        bus.subscribe(subjects.endpoint_state(B)) as states,
    ):
        crash(before)
        await next_event(events, ChildRestarted, f"endpoint:{B}")
        announced = await next_event(states, EndpointState)
    reply = await bus.request(
        subjects.endpoint_get(B), StateRequest(), reply_type=EndpointState, timeout=WAIT
    )

    assert child(tree, "endpoints", f"endpoint:{B}") is not before
    assert announced.circuit_state == "closed"
    assert isinstance(reply, EndpointState) and reply.endpoint == B
    assert B in [c.endpoint for c in (await plan(bus)).candidates]


async def test_tree_restarts_a_crashed_health_view_which_reports_every_endpoint(
    bus: InProcessBus,
    tree: Supervisor,
) -> None:
    await open_a(bus)
    before = tree.child("health")
    assert isinstance(before, Actor)

    async with bus.subscribe(subjects.supervisor_event("root")) as events:
        crash(before)
        await next_event(events, ChildRestarted, "health")
    report = await bus.request(
        subjects.HEALTH_DEEP, HealthRequest(), reply_type=HealthReport, timeout=WAIT
    )

    assert isinstance(report, HealthReport)
    assert {s.endpoint: s.circuit_state for s in report.endpoints} == {
        A: "open",
        B: "closed",
        "demo:echo": "closed",
    }
