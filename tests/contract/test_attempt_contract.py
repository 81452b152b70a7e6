"""One behaviour suite that every ``AttemptKind`` passes (``dispatch.ONCE`` and
``stream_attempt.STREAM``), as tests/contract/test_adapter_contract.py does for adapters.

What the seam promises the failover loop (gateway/ingress/failover.py): an attempt returns the
kind's result on success and is observed once as a success with its latency and usage; a
failure is returned, never raised, and observed once with the outcome its error earns; the
attempt's capacity lease is given back exactly once on every path (a success: once its result
is consumed, or ``discard``-ed after losing a hedge race), and a success is observed by then; a
cancellation propagates and still gives the lease back; no first byte within the limit (the
route's own, or the request's budget) is an ``UpstreamTimeoutError``. Only what both kinds
share is asserted here; what is one kind's own (a stream's commitment, idle limit, first token)
is in tests/unit/gateway/ingress/test_dispatcher.py, whose scripted in-process adapter (a
stand-in for the upstream seam, see its docstring) and injected clock drive these rows too.
Leases are held by a real LeaseKeeper and given back over the in-process bus.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from bus import InProcessBus
from gateway.ingress.dispatch import ONCE, Dispatcher
from gateway.ingress.hedging import DECLINED, Declined
from gateway.ingress.request_info import Attempt, RequestInfo, Served
from gateway.ingress.settling import LeaseKeeper
from gateway.ingress.stream_attempt import STREAM, StreamAttempt
from schemas import CapacityRelease, Observation, UpstreamError, UpstreamTimeoutError, subjects
from schemas.config import FailoverConfig
from tests.unit.gateway.ingress.test_dispatcher import (
    HI,
    SHORT,
    Answer,
    Fail,
    FakeClock,
    FixedTargets,
    Hang,
    Heard,
    ScriptedAdapter,
    cand,
    plan,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from gateway.adapters.base import JSON, Adapter, UpstreamTarget
    from gateway.ingress.failover import AttemptKind
    from gateway.ingress.plan_walk import Targets

POOL, LEASE = "pool-a", "lease-a"


async def _whole_answer(a: Adapter, target: UpstreamTarget, model: str) -> JSON:
    return await a.complete(target, HI)


@dataclass(frozen=True)
class Kind:
    """One ``AttemptKind`` under contract: what it is sent, what its success is, how the
    loop's caller consumes that success, and which upstream streams it opens (each must be
    closed by the time the attempt's result is let go of)."""

    kind: AttemptKind[Any, Any]
    payload: Any
    result_type: type[Served] | type[StreamAttempt]
    stream: bool

    async def consume(self, result: Any) -> None:
        """What the caller does with a success once it is served (a whole answer outside a
        hedge race is settled once written, as ``Dispatcher.call`` does)."""
        if isinstance(result, StreamAttempt):
            async for _ in result.batches():
                pass
            await result.close("success")
        elif result.settle is not None:
            await result.settle()

    def opened(self, adapter: ScriptedAdapter) -> list[str]:
        """The upstream streams the attempts opened (a whole answer opens none)."""
        return list(adapter.calls) if self.stream else []


KINDS = {
    "once": Kind(ONCE, _whole_answer, Served, stream=False),
    "stream": Kind(STREAM, HI, StreamAttempt, stream=True),
}


@pytest.fixture(params=list(KINDS))
def kind(request: pytest.FixtureRequest) -> Kind:
    return KINDS[request.param]


@dataclass
class Rig:
    """One attempt of ``kind`` on candidate ``a`` holding lease ``LEASE`` of ``POOL``, through
    a Dispatcher over the scripted adapter, the fake clock and the in-process bus."""

    kind: Kind
    bus: InProcessBus
    leases: LeaseKeeper
    heard: Heard
    clock: FakeClock = field(default_factory=FakeClock)
    adapter: ScriptedAdapter = field(init=False)
    targets: Targets = field(default_factory=FixedTargets)
    failover: FailoverConfig = field(default_factory=FailoverConfig)
    declined: Declined = field(default_factory=Declined)

    def __post_init__(self) -> None:
        self.adapter = ScriptedAdapter(self.clock)

    async def attempt(self, *, hold: bool = False, started_ago: float = 0.0) -> Any:
        """The attempt's result (a success, or the UpstreamError it failed with)."""
        leased = cand("a", pool=POOL, lease_id=LEASE)
        self.leases.hold_plan(plan(leased))
        d = Dispatcher(
            self.bus,
            {"fake": self.adapter},
            self.targets,
            self.failover,
            self.leases,
            clock=self.clock,
        )
        info = RequestInfo(
            request_id="req-1",
            surface="chat",
            stream=self.kind.stream,
            started=self.clock() - started_ago,
        )
        a = Attempt(1, leased, True, True, "m")
        k = self.kind
        return await k.kind.attempt(d, info, k.payload, a, d.budget(info), self.declined, hold)

    async def observations(self) -> list[Observation]:
        return (await self.heard.drain()).observations()

    async def releases(self) -> list[CapacityRelease]:
        """Every lease given back so far (the lease keeper holds none of them any more)."""
        heard = await self.heard.drain()
        return [m for _, m in heard.messages if isinstance(m, CapacityRelease)]

    async def given_back_once(self, used: float | None) -> None:
        assert self.leases.held() == 0
        assert await self.releases() == [
            CapacityRelease(pool=POOL, lease_id=LEASE, used_units=used)
        ]

    def nothing_left_open(self) -> None:
        assert sorted(self.adapter.closed) == sorted(self.kind.opened(self.adapter))


@pytest.fixture
async def rig(kind: Kind) -> AsyncIterator[Rig]:
    bus = InProcessBus()
    leases = LeaseKeeper(bus, 30.0, "ingress")
    heard = Heard(bus)
    async with bus.subscribe(subjects.PREFIX + ".>") as sub:
        heard._sub = sub
        yield Rig(kind, bus, leases, heard)
    await leases.aclose()
    await bus.aclose()


# -- success ----------------------------------------------------------------------------------


async def test_attempt_success_returns_the_kinds_result_observed_once_with_its_latency(
    rig: Rig,
) -> None:
    rig.adapter.scripts = {"a": [Answer(takes=0.25, usage=(11, 7))]}

    result = await rig.attempt()
    await rig.kind.consume(result)

    assert isinstance(result, rig.kind.result_type)
    assert (result.candidate.endpoint, result.model) == ("a", "m")
    (obs,) = await rig.observations()
    assert (obs.endpoint, obs.attempt, obs.outcome, obs.error_kind) == ("a", 1, "success", "")
    assert (obs.prompt_tokens, obs.completion_tokens) == (11, 7)
    assert obs.latency_ms == pytest.approx(250.0)


async def test_attempt_success_gives_its_lease_back_once_with_the_reported_tokens(
    rig: Rig,
) -> None:
    rig.adapter.scripts = {"a": [Answer(usage=(11, 7))]}

    await rig.kind.consume(await rig.attempt())

    await rig.given_back_once(18.0)
    rig.nothing_left_open()


# -- failure ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(500, "failure"), (429, "failure"), (400, "client_error"), (None, "failure")],
)
async def test_attempt_failure_is_returned_observed_once_and_gives_its_lease_back(
    rig: Rig, status: int | None, outcome: str
) -> None:
    rig.adapter.scripts = {"a": [Fail(status, takes=0.1, retry_after=3.0)]}

    err = await rig.attempt()

    assert isinstance(err, UpstreamError)
    assert (err.endpoint, err.status, err.retry_after) == ("a", status, 3.0)
    (obs,) = await rig.observations()
    assert (obs.endpoint, obs.outcome, obs.status) == ("a", outcome, status)
    assert obs.latency_ms == pytest.approx(100.0)
    await rig.given_back_once(0.0)  # an error answer generated nothing
    rig.nothing_left_open()


# -- first byte -------------------------------------------------------------------------------


async def test_attempt_without_a_first_byte_in_its_limit_is_an_upstream_timeout(
    rig: Rig,
) -> None:
    rig.targets = FixedTargets(timeout=SHORT, ttft=SHORT)
    rig.adapter.scripts = {"a": [Hang()]}

    err = await rig.attempt()

    assert isinstance(err, UpstreamTimeoutError)
    assert (err.endpoint, err.kind) == ("a", "ttft")
    (obs,) = await rig.observations()
    assert (obs.outcome, obs.error_kind) == ("failure", "ttft")
    await rig.given_back_once(None)  # the upstream may have generated: usage unknown
    rig.nothing_left_open()


async def test_attempt_cut_short_by_the_spent_budget_is_a_cancelled_upstream_timeout(
    rig: Rig,
) -> None:
    rig.failover = FailoverConfig(budget_seconds=0.3)
    rig.adapter.scripts = {"a": [Hang()]}

    err = await rig.attempt(started_ago=0.3)

    assert isinstance(err, UpstreamTimeoutError)
    assert (err.endpoint, err.kind) == ("a", "budget")
    (obs,) = await rig.observations()
    assert (obs.outcome, obs.error_kind) == ("cancelled", "budget")  # not the endpoint's fault
    await rig.given_back_once(None)
    rig.nothing_left_open()


# -- hedge races and cancellation -------------------------------------------------------------


async def test_attempt_discarded_after_losing_a_hedge_race_leaks_nothing(rig: Rig) -> None:
    rig.adapter.scripts = {"a": [Answer()]}

    result = await rig.attempt(hold=True)
    await rig.kind.kind.discard(result)

    assert isinstance(result, rig.kind.result_type)
    (obs,) = await rig.observations()
    assert obs.endpoint == "a"
    assert rig.leases.held() == 0
    assert [(r.pool, r.lease_id) for r in await rig.releases()] == [(POOL, LEASE)]
    rig.nothing_left_open()


@pytest.mark.parametrize(("declined", "error_kind"), [(False, ""), (True, DECLINED)])
async def test_attempt_cancelled_propagates_and_still_gives_its_lease_back(
    rig: Rig, declined: bool, error_kind: str
) -> None:
    rig.adapter.scripts = {"a": [Hang()]}
    rig.declined.declined = declined  # the loser of a hedge race, or a client gone away
    returned: list[Any] = []

    async def attempt() -> None:
        returned.append(await rig.attempt())

    async with anyio.create_task_group() as tg:
        tg.start_soon(attempt)
        await rig.adapter.entered.wait()
        tg.cancel_scope.cancel()

    assert returned == []  # the cancellation was raised, not turned into a result
    (obs,) = await rig.observations()
    assert (obs.endpoint, obs.outcome, obs.error_kind) == ("a", "cancelled", error_kind)
    await rig.given_back_once(None)
    rig.nothing_left_open()
