"""LeaseKeeper on the in-process bus: one batched renewal per pool per interval from one task,
fallbacks leased before dispatch (refused: None), releases published once."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import anyio

from actors import ChildSpec, Supervisor
from actors.capacity import CapacityActor
from gateway.adapters.base import error_from_status
from gateway.adapters.registry import make_adapters, make_http_client
from gateway.adapters.upstream_http import transport_error
from gateway.ingress.dispatch import Dispatcher
from gateway.ingress.failover import tokens_used_by_failure
from gateway.ingress.plan_walk import Targets
from gateway.ingress.request_info import RequestInfo
from gateway.ingress.settling import LeaseKeeper
from schemas import (
    CapacityAcquire,
    CapacityGrant,
    CapacityRelease,
    CapacityRenew,
    RouteCandidate,
    RoutePlan,
    UpstreamError,
    UpstreamTimeoutError,
    subjects,
)
from schemas.capacity import PoolSpec
from schemas.config import GatewayConfig, LeaseConfig
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

    from bus import InProcessBus
    from tests.fixtures.upstream import FakeUpstream

WAIT = 5.0


class _Ticks:
    """The keeper's sleep: returns when the test ticks, so renewals run on demand."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[None] = asyncio.Queue()

    async def __call__(self, seconds: float) -> None:
        assert seconds == 10.0  # ttl / 3
        await self.queue.get()


def _leased(pool: str, lease_id: str) -> RouteCandidate:
    return RouteCandidate(endpoint=f"m:{pool}", kind="echo", pool=pool, lease_id=lease_id)


async def test_held_leases_are_renewed_in_one_message_per_pool_and_released_once(
    bus: InProcessBus,
) -> None:
    ticks = _Ticks()
    keeper = LeaseKeeper(bus, 30.0, "ing-1", sleep=ticks)
    async with (
        bus.subscribe(subjects.capacity_renew("a")) as renew_a,
        bus.subscribe(subjects.capacity_renew("b")) as renew_b,
        bus.subscribe(subjects.capacity_release("a")) as releases,
    ):
        keeper.hold_plan(
            RoutePlan(
                model="m",
                candidates=(
                    _leased("a", "1"),
                    _leased("a", "2"),
                    _leased("b", "3"),
                    RouteCandidate(endpoint="m:x", kind="echo"),
                ),
            )
        )
        ticks.queue.put_nowait(None)
        async with asyncio.timeout(WAIT):
            got_a, got_b = (
                (await anext(aiter(renew_a))).message,
                (await anext(aiter(renew_b))).message,
            )
        assert got_a == CapacityRenew(pool="a", holder="ing-1", lease_ids=("1", "2"))
        assert got_b == CapacityRenew(pool="b", holder="ing-1", lease_ids=("3",))
        await keeper.release(_leased("a", "1"), tokens=42)
        await keeper.release(_leased("a", "1"), tokens=42)  # twice: published once
        await keeper.release(_leased("a", "2"))
        async with asyncio.timeout(WAIT):
            first = (await anext(aiter(releases))).message
            second = (await anext(aiter(releases))).message
        assert first == CapacityRelease(pool="a", lease_id="1", used_units=42.0)
        assert second == CapacityRelease(pool="a", lease_id="2", used_units=None)
        assert keeper.held() == 1
    await keeper.aclose()


async def test_a_fallback_is_leased_before_dispatch_and_skipped_when_refused(
    bus: InProcessBus,
) -> None:
    spec = PoolSpec("p", "concurrency", 1.0, None, ("m:p",))
    root = Supervisor("t", children=[ChildSpec("cap", lambda: CapacityActor(spec, LeaseConfig()))])
    await root.start(bus)
    keeper = LeaseKeeper(bus, 30.0, "ing-1")
    try:
        bare = RouteCandidate(endpoint="m:p", kind="echo", pool="p")
        leased = await keeper.acquire(bare, "r1")
        assert leased is not None and leased.lease_id and keeper.held() == 1
        assert await keeper.acquire(bare, "r2") is None
        await keeper.release(leased)
        assert await keeper.acquire(bare, "r3") is not None
    finally:
        await keeper.aclose()
        await root.stop()


def test_a_failure_releases_zero_tokens_only_when_the_upstream_generated_nothing() -> None:
    refused = error_from_status("m:a", 429, {}, b'{"error": {"message": "slow down"}}')
    reset = transport_error("m:a", ConnectionResetError())  # the request may have gone out
    paced = error_from_status("m:a", 429, {"x-ratelimit-remaining-requests": "0"}, b"{}")
    assert tokens_used_by_failure(refused) == 0
    assert (paced.kind, tokens_used_by_failure(paced)) == ("rate_limit_exceeded", 0)
    assert tokens_used_by_failure(UpstreamError("x", kind="connect")) == 0
    # Unknown: the upstream may have generated, so a token quota keeps its estimate.
    assert tokens_used_by_failure(UpstreamTimeoutError("late", kind="ttft")) is None
    assert tokens_used_by_failure(UpstreamError("cut", kind="truncated")) is None
    assert tokens_used_by_failure(UpstreamError("empty", kind="empty_stream")) is None
    assert (reset.kind, tokens_used_by_failure(reset)) == ("transport", None)


async def test_a_stream_to_a_route_without_an_adapter_gives_its_lease_back(
    bus: InProcessBus,
    fake_upstream: FakeUpstream,
) -> None:
    http = make_http_client()
    adapters = {k: v for k, v in make_adapters(http).items() if k != "anthropic"}
    dispatcher = Dispatcher(bus, adapters, Targets(GatewayConfig()))
    leased = RouteCandidate(
        endpoint="m:a",
        kind="anthropic",
        pool="a",
        lease_id="1",
        base_url=fake_upstream.anthropic_base_url,
        upstream_model="x",
    )
    plan = RoutePlan(model="m", candidates=(leased, RouteCandidate(endpoint="m:e", kind="echo")))
    info = RequestInfo(request_id="r", surface="chat", stream=True)
    try:
        async with bus.subscribe(subjects.capacity_release("a")) as releases:
            attempt = await dispatcher.open_stream(
                info, plan, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            )
            await attempt.close("success")
            async with asyncio.timeout(WAIT):
                released = (await anext(aiter(releases))).message
        assert attempt.candidate.endpoint == "m:e"  # the next route served
        # Nothing was sent: a quota's charge of it comes back too.
        assert released == CapacityRelease(pool="a", lease_id="1", used_units=None, unsent=True)
        assert dispatcher.leases.held() == 0 and fake_upstream.requests == []
    finally:
        await dispatcher.leases.aclose()
        await http.aclose()


async def test_a_grant_that_arrives_after_the_client_went_away_is_still_held(
    bus: InProcessBus,
) -> None:
    keeper = LeaseKeeper(bus, 30.0, "ing-1")
    bare = RouteCandidate(endpoint="m:p", kind="echo", pool="p")
    got: list[RouteCandidate | None] = []
    scope = anyio.CancelScope()

    async def ask() -> None:
        with scope:
            got.append(await keeper.acquire(bare, "r1"))
            await anyio.sleep_forever()  # the cancellation lands at the next checkpoint

    try:
        async with bus.subscribe(subjects.capacity_acquire("p")) as owner:
            task = asyncio.create_task(ask())
            async with asyncio.timeout(WAIT):
                env = await anext(aiter(owner))
            scope.cancel()  # the client goes away while the owner is deciding
            await env.respond(CapacityGrant(pool="p", granted=True, lease_id="L"))
            async with asyncio.timeout(WAIT):
                await task
        assert [c.lease_id if c else None for c in got] == ["L"]
        assert keeper.held() == 1  # held, so the ending attempt releases it
    finally:
        await keeper.aclose()


async def test_a_lease_whose_answer_never_came_is_given_back_by_the_id_it_was_asked_under(
    bus: InProcessBus,
) -> None:
    keeper = LeaseKeeper(bus, 30.0, "ing-1")
    keeper.acquire_timeout = 0.05  # the owner's answer is late (a NATS reconnect, say)
    bare = RouteCandidate(endpoint="m:p", kind="echo", pool="p")
    try:
        async with (
            bus.subscribe(subjects.capacity_acquire("p")) as owner,
            bus.subscribe(subjects.capacity_release("p")) as releases,
        ):
            got = await keeper.acquire(bare, "r1")
            async with asyncio.timeout(WAIT):
                asked = (await anext(aiter(owner))).message
                released = (await anext(aiter(releases))).message
        assert got is None and keeper.held() == 0
        assert isinstance(asked, CapacityAcquire) and asked.lease_id
        assert released == CapacityRelease(
            pool="p", lease_id=asked.lease_id, used_units=0.0, unsent=True
        )
    finally:
        await keeper.aclose()


async def test_a_reloaded_ttl_sets_the_renewal_interval(bus: InProcessBus) -> None:
    slept: asyncio.Queue[float] = asyncio.Queue()
    go: asyncio.Queue[None] = asyncio.Queue()

    async def sleep(seconds: float) -> None:
        slept.put_nowait(seconds)
        await go.get()

    keeper = LeaseKeeper(bus, 30.0, "ing-1", sleep=sleep)
    keeper.hold_plan(RoutePlan(model="m", candidates=(_leased("a", "1"),)))
    try:
        async with asyncio.timeout(WAIT):
            assert await slept.get() == 10.0
            keeper.retune(6.0)  # a reload shortened the TTL: renew before it runs out
            go.put_nowait(None)
            assert await slept.get() == 2.0
    finally:
        await keeper.aclose()


async def test_an_ingress_reload_retunes_its_lease_renewals(
    bus: InProcessBus, tmp_path: Path
) -> None:
    from gateway.ingress.app import create_app

    def with_ttl(ttl: float) -> GatewayConfig:
        return GatewayConfig.model_validate(
            {
                "database": {"path": str(tmp_path / "gw.sqlite3")},
                "routing": {"leases": {"ttl_seconds": ttl}},
            }
        )

    app = create_app(bus, with_ttl(30))
    try:
        assert app.leases.interval == 10
        app.reconfigure(with_ttl(6))
        assert app.leases.interval == 2
    finally:
        await app.aclose()


async def test_a_walked_plan_that_arrives_after_the_client_went_away_gives_its_lease_back(
    bus: InProcessBus,
    fake_upstream: FakeUpstream,
) -> None:
    from gateway.ingress.plan_walk import PlanWalk
    from schemas.config import ModelConfig

    fake_upstream.set_default(Reply(500))
    http = make_http_client()
    dispatcher = Dispatcher(bus, make_adapters(http), Targets(GatewayConfig()))
    info = RequestInfo(request_id="r", surface="chat", stream=False)
    asked, answer = asyncio.Event(), asyncio.Event()
    failing = RouteCandidate(
        endpoint="a:x",
        kind="openai_compat",
        upstream_model="x",
        base_url=fake_upstream.openai_base_url,
    )
    leased = RouteCandidate(endpoint="b:x", kind="echo", pool="b", lease_id="L2")

    async def ask(model: ModelConfig) -> RoutePlan:
        if model.id == "a":
            return RoutePlan(model="a", candidates=(failing,))
        asked.set()
        await answer.wait()  # the owner decides (and leases) while the client goes away
        return RoutePlan(model="b", candidates=(leased,))

    walk = PlanWalk(tuple(ModelConfig.model_validate({"id": m}) for m in "ab"), ask)
    scope = anyio.CancelScope()

    async def serve() -> None:
        async def op(adapter: Any, target: Any, model: str) -> Any:
            return await adapter.complete(
                target, {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
            )

        with scope:
            await dispatcher.call(info, await walk.first(), op, walk)

    try:
        async with bus.subscribe(subjects.capacity_release("b")) as releases:
            task = asyncio.create_task(serve())
            async with asyncio.timeout(WAIT):
                await asked.wait()
                scope.cancel()
                answer.set()
                await task
                released = (await anext(aiter(releases))).message
        assert isinstance(released, CapacityRelease)
        assert (released.pool, released.lease_id) == ("b", "L2")
        assert dispatcher.leases.held() == 0
    finally:
        await dispatcher.leases.aclose()
        await http.aclose()


async def test_a_lease_held_past_its_maximum_age_is_no_longer_renewed(
    bus: InProcessBus,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ticks = _Ticks()
    now = [0.0]
    keeper = LeaseKeeper(bus, 30.0, "ing-1", sleep=ticks, max_age=100.0, clock=lambda: now[0])
    async with bus.subscribe(subjects.capacity_renew("a")) as renewals:
        keeper.hold_plan(RoutePlan(model="m", candidates=(_leased("a", "forgotten"),)))
        now[0] = 90.0
        keeper.hold_plan(RoutePlan(model="m", candidates=(_leased("a", "recent"),)))
        now[0] = 120.0  # "forgotten" is past its maximum age: its owner expired it
        ticks.queue.put_nowait(None)
        async with asyncio.timeout(WAIT):
            renewal = (await anext(aiter(renewals))).message
    assert renewal == CapacityRenew(pool="a", holder="ing-1", lease_ids=("recent",))
    assert keeper.held() == 1
    assert any(
        "pool a held for 120s, past its maximum age" in r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING"
    )
    await keeper.aclose()


async def test_a_plan_refused_by_the_callers_limits_gives_its_primarys_lease_back(
    bus: InProcessBus,
) -> None:
    """The limits refused the request after routing: nothing is attempted, and the capacity
    lease the plan arrived with is released at once (not left to its TTL)."""
    dispatcher = Dispatcher(bus, {}, Targets(GatewayConfig()))
    leased = RouteCandidate(endpoint="m:a", kind="echo", pool="a", lease_id="1")
    plan = RoutePlan(model="m", candidates=(leased, RouteCandidate(endpoint="m:e", kind="echo")))
    info = RequestInfo(request_id="r", surface="chat", stream=False)
    try:
        async with bus.subscribe(subjects.capacity_release("a")) as releases:
            await dispatcher.release_plan(info, plan)
            async with asyncio.timeout(WAIT):
                released = (await anext(aiter(releases))).message
        # Never sent: a quota's charge of it comes back too.
        assert released == CapacityRelease(pool="a", lease_id="1", used_units=None, unsent=True)
        assert dispatcher.leases.held() == 0
    finally:
        await dispatcher.leases.aclose()
