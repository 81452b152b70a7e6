"""Config reload on the actor side: tree diffs and the ConfigActor applying them live."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import pytest

from actors import ChildSpec, ConfigActor, ConfigState, Supervisor, build_tree
from actors.reconfigure import diff
from bus import InProcessBus, NoRespondersError
from schemas import (
    AdminCommand,
    AdminExecuted,
    AdminReply,
    ConfigChanged,
    ErrorReply,
    InvalidRequestError,
    RoutePlan,
    RouteRequest,
    subjects,
)
from schemas.config import GatewayConfig
from tests.unit.actors import WAIT, next_event

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


def cfg(*models: tuple[str, float]) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {"models": [{"id": m, "route": [{"kind": "echo", "weight": w}]} for m, w in models]}
    )


def labels(old: GatewayConfig, new: GatewayConfig) -> list[str]:
    return [f"{c.kind} {c.label}" for c in diff(build_tree(old), build_tree(new))]


def test_diff_of_equal_configs_is_empty() -> None:
    assert labels(cfg(("a", 1)), cfg(("a", 1))) == []


def test_diff_adds_endpoints_before_models_and_replaces_changed_ones() -> None:
    assert labels(cfg(("a", 1), ("b", 1)), cfg(("a", 2), ("c", 1))) == [
        "add endpoints/endpoint:c:echo",
        "remove endpoints/endpoint:b:echo",
        "replace keys/keys:registry",  # it checks admin commands against the pools it knows
        "add keys/keypool:c:echo",
        "remove keys/keypool:b:echo",
        "replace routewise_settings",  # it resolves model ids and aliases
        "replace models/model:a",
        "add models/model:c",
        "remove models/model:b",
        "replace health",
        "replace routing_admin",
        "replace degraded_mode",
        "replace steering",  # it ranks over the catalogue; its chains backfill on a reload
    ]


def test_diff_keeps_children_whose_factory_is_not_a_partial() -> None:
    old = Supervisor("root", children=[ChildSpec("x", lambda: Supervisor("x"))])
    new = Supervisor("root", children=[ChildSpec("x", lambda: Supervisor("x"))])
    assert diff(old, new) == []


@pytest.fixture
async def bus() -> AsyncIterator[InProcessBus]:
    b = InProcessBus()
    yield b
    await b.aclose()


class Loader:
    """What the ConfigActor reads on reload: a config, or the refusal of a broken file."""

    def __init__(self) -> None:
        self.next: GatewayConfig | str = cfg()

    def __call__(self) -> tuple[GatewayConfig, str]:
        if isinstance(self.next, str):
            raise InvalidRequestError(self.next)
        return self.next, f"v{len(self.next.models)}"


@pytest.fixture
async def running(bus: InProcessBus) -> AsyncIterator[tuple[Supervisor, Loader]]:
    start = cfg(("a", 1), ("b", 1))
    root = build_tree(start)
    await root.start(bus)
    load = Loader()
    state = ConfigState(start, "v2", build_tree(start), "<test>")
    await root.add_child(
        ChildSpec(
            "config", functools.partial(ConfigActor, root, state, load=load, build=build_tree)
        )
    )
    yield root, load
    await root.stop()


async def command(bus: InProcessBus, verb: str) -> AdminReply | ErrorReply:
    return await bus.request(
        subjects.admin("config", verb), AdminCommand(by="test"), reply_type=AdminReply, timeout=WAIT
    )


async def route(bus: InProcessBus, model: str) -> Any:
    return await bus.request(
        subjects.model_route(model), RouteRequest(model=model), reply_type=RoutePlan, timeout=WAIT
    )


async def test_reload_adds_and_removes_models_live_and_announces_it(
    bus: InProcessBus, running: tuple[Supervisor, Loader]
) -> None:
    _, load = running
    load.next = cfg(("a", 1), ("c", 1))
    async with bus.subscribe(subjects.event("config")) as events:
        reply = await command(bus, "reload")
        changed = await next_event(events, ConfigChanged)
    assert isinstance(reply, AdminReply), reply
    assert (reply.result["added"], reply.result["removed"]) == (["c"], ["b"])
    assert (changed.version, changed.added, changed.removed, changed.by) == (
        "v2",
        ("c",),
        ("b",),
        "test",
    )
    assert isinstance(await route(bus, "c"), RoutePlan)
    with pytest.raises(NoRespondersError):
        await route(bus, "b")
    shown = await command(bus, "show")
    assert isinstance(shown, AdminReply) and shown.result["models"] == ["a", "c"]


async def test_reload_of_an_invalid_config_is_refused_whole(
    bus: InProcessBus, running: tuple[Supervisor, Loader]
) -> None:
    _, load = running
    load.next = "cfg.yaml: models[0].route[0].weight: Input should be >= 0"
    async with bus.subscribe(subjects.event("admin")) as audit:
        reply = await command(bus, "reload")
        assert isinstance(reply, ErrorReply)
        assert reply.message == load.next and reply.code == "invalid_request"
        executed = await next_event(audit, AdminExecuted)
    assert (executed.area, executed.verb, executed.ok) == ("config", "reload", False)
    assert isinstance(await route(bus, "b"), RoutePlan)
    shown = await command(bus, "show")
    assert isinstance(shown, AdminReply) and shown.result["version"] == "v2"


async def test_reload_after_a_restart_of_the_config_actor_diffs_against_the_running_tree(
    bus: InProcessBus, running: tuple[Supervisor, Loader]
) -> None:
    root, load = running
    load.next = cfg(("a", 1), ("c", 1))
    assert isinstance(await command(bus, "reload"), AdminReply)
    await root.replace_child(root.specs[-1])  # a fresh ConfigActor incarnation
    reply = await command(bus, "reload")
    assert isinstance(reply, AdminReply) and reply.result["children"] == []


async def test_reload_leaving_an_admin_chain_naming_a_removed_model_is_refused_before_any_change(
    bus: InProcessBus, running: tuple[Supervisor, Loader]
) -> None:
    """It was checked once the new tree had started: the steering restarted on the new
    config (its chains saving what they had seen of it) before going back."""
    root, load = running
    created = await bus.request(
        subjects.admin("chains", "create"),
        AdminCommand(args={"name": "team", "models": ["b", "a"]}),
        reply_type=AdminReply,
        timeout=WAIT,
    )
    models = root.child("models")
    assert isinstance(models, Supervisor)
    steering, model_b = root.child("steering"), models.child("model:b")
    load.next = cfg(("a", 2))

    reply = await command(bus, "reload")

    assert isinstance(created, AdminReply), created
    assert isinstance(reply, ErrorReply) and reply.code == "invalid_request"
    assert reply.message == (
        "<test>: chain 'team' names 'b', which is no model id of this config; the running "
        "config stays (a chain made or edited by an admin command outlives a reload: take the "
        "model out of it first, llmgw admin chains set_models --arg name=team --arg "
        "'models=[\"a\"]')"
    )
    assert root.child("steering") is steering
    assert models.child("model:b") is model_b
    assert isinstance(await route(bus, "b"), RoutePlan)
