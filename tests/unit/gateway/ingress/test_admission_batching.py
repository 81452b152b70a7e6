"""The ingress's admission against a real LimitsActor on the in-process bus: what one turn
of the event loop begins goes to the owner as one message, verdicts come back to the right
requests, and a request that goes away while its verdict is on the way gives its lease back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from actors.limits import LimitsActor
from bus import Bus, InProcessBus, NatsBus
from gateway.auth.gate import Caller
from gateway.ingress.admission import Admission
from schemas import AdminCommand, AdminReply, LimitsUnavailableError, RateLimitedError, subjects
from schemas.config import GatewayConfig
from schemas.limits import AdmitBatch, AdmitRequest, LimitsConfig, LimitSettle, LimitSettleBatch
from tests.fixtures.logs import log_lines

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from gateway.ingress.admission_ticket import Ticket

WAIT = 5.0
CALLER = Caller(key_hash="h", role="pro", key_id="k-1", org="acme", user="ann")


class _Req:
    """What a Ticket writes its rate headers on."""

    extra_headers: list[tuple[bytes, bytes]] | None = None


@contextlib.asynccontextmanager
async def _owner(tmp_path: Path, bus: Bus | None = None) -> AsyncIterator[tuple[Bus, Admission]]:
    """A LimitsActor and this ingress's Admission on one bus (in-process unless given)."""
    bus = bus or InProcessBus()
    actor = LimitsActor(str(tmp_path / "limits.db"), LimitsConfig(snapshot_seconds=3600))
    async with anyio.create_task_group() as tg:
        await tg.start(actor.run, bus)
        admission = Admission(bus, GatewayConfig.model_validate({"models": []}))
        await admission.start()
        yield bus, admission
        await admission.aclose()
        actor.request_stop()
    await bus.aclose()


async def _limit(bus: Bus, admission: Admission, **spec: Any) -> None:
    reply = await bus.request(
        subjects.admin("limits", "set"),
        AdminCommand(args={"kind": "key", "id": "k-1", **spec}, by="t"),
        reply_type=AdminReply,
        timeout=WAIT,
    )
    assert isinstance(reply, AdminReply), reply
    await admission.refresh()


async def _usage(bus: Bus) -> dict[str, Any]:
    reply = await bus.request(
        subjects.admin("limits", "get"),
        AdminCommand(args={"subject": "key:k-1"}, by="t"),
        reply_type=AdminReply,
        timeout=WAIT,
    )
    assert isinstance(reply, AdminReply)
    usage: dict[str, Any] = reply.result["usage"]
    return usage


def _begin(admission: Admission, n: int) -> list[Ticket]:
    tickets = [
        admission.begin(_Req(), CALLER, f"r{i}", None, {"max_tokens": 10}, 5)  # type: ignore[arg-type]
        for i in range(n)
    ]
    assert all(t is not None for t in tickets)
    return [t for t in tickets if t is not None]


async def _outcome(ticket: Ticket) -> str:
    try:
        await ticket.decide()
    except RateLimitedError:
        return "refused"
    return "admitted"


async def test_one_turns_admissions_and_settles_go_as_one_message_each(tmp_path: Path) -> None:
    async with (
        _owner(tmp_path) as (bus, admission),
        bus.subscribe(subjects.LIMITS_ADMIT) as admits,
        bus.subscribe(subjects.LIMITS_SETTLE) as settles,
    ):
        await _limit(bus, admission, concurrency=3)
        tickets = _begin(admission, 5)  # one turn: nothing awaited between them
        outcomes = [await _outcome(t) for t in tickets]
        # Three slots: the first three in the batch's order take them.
        assert outcomes == ["admitted"] * 3 + ["refused"] * 2
        with anyio.fail_after(WAIT):
            sent = (await anext(aiter(admits))).message
        assert isinstance(sent, AdmitBatch)
        assert [r.request_id for r in sent.requests] == [f"r{i}" for i in range(5)]
        assert (await _usage(bus))["in_flight"] == 3
        for t in tickets:
            await t.finish()
        with anyio.fail_after(WAIT):
            settled = (await anext(aiter(settles))).message
        assert isinstance(settled, LimitSettleBatch)
        assert sorted(s.request_id for s in settled.settles) == ["r0", "r1", "r2"]
        assert (await _usage(bus))["in_flight"] == 0


async def test_a_lone_admission_is_a_plain_request(tmp_path: Path) -> None:
    async with (
        _owner(tmp_path) as (bus, admission),
        bus.subscribe(subjects.LIMITS_ADMIT) as admits,
        bus.subscribe(subjects.LIMITS_SETTLE) as settles,
    ):
        await _limit(bus, admission, rpm=10)
        (ticket,) = _begin(admission, 1)
        assert await _outcome(ticket) == "admitted"
        with anyio.fail_after(WAIT):
            assert isinstance((await anext(aiter(admits))).message, AdmitRequest)
        await ticket.finish()
        with anyio.fail_after(WAIT):
            assert isinstance((await anext(aiter(settles))).message, LimitSettle)


async def test_a_request_gone_before_its_verdict_gives_its_slot_back(tmp_path: Path) -> None:
    async with (
        _owner(tmp_path) as (bus, admission),
        bus.subscribe(subjects.LIMITS_SETTLE) as settles,
    ):
        await _limit(bus, admission, concurrency=1)
        (ticket,) = _begin(admission, 1)
        waiting = asyncio.ensure_future(ticket.decide())
        await asyncio.sleep(0)  # it waits for the verdict now
        waiting.cancel()  # the client went away
        with anyio.fail_after(WAIT):
            released = (await anext(aiter(settles))).message
        assert isinstance(released, LimitSettle) and released.request_id == "r0"
        assert (await _usage(bus))["in_flight"] == 0
        (again,) = _begin(admission, 1)
        assert await _outcome(again) == "admitted"  # the slot was not held until its TTL


@pytest.mark.nats
async def test_a_verdict_too_late_to_admit_its_request_gives_the_lease_back(
    tmp_path: Path, nats_url: str
) -> None:
    async with _owner(tmp_path, await NatsBus.connect(nats_url)) as (bus, admission):
        await _limit(bus, admission, concurrency=1)
        # The owner decides, but too late for its answer to count (slow to save, taking over).
        patient = admission.settings
        admission.settings = patient.model_copy(update={"decision_timeout_seconds": 1e-6})
        (late,) = _begin(admission, 1)
        with pytest.raises(LimitsUnavailableError):
            await late.decide()
        await late.finish()
        admission.settings = patient
        (again,) = _begin(admission, 1)
        # Without a settle, the slot stayed with the refused request until its lease's TTL.
        assert await _outcome(again) == "admitted"
        assert (await _usage(bus))["in_flight"] == 1


async def test_settles_no_owner_acknowledged_are_kept_and_counted_once_it_is_back(
    tmp_path: Path,
) -> None:
    async with _owner(tmp_path) as (bus, admission):  # the limit, stored by its owner
        await _limit(bus, admission, budget="10/day")
    bus = InProcessBus()
    config = GatewayConfig.model_validate({"models": [], "limits": {"lease_ttl_seconds": 0.3}})
    admission = Admission(bus, config)  # renews, and pays what it owes, every 0.1 s
    await admission.start()
    done = LimitSettle(request_id="r1", subjects=("key:k-1",), role="pro", cost_usd=0.25)
    try:
        with log_lines("gateway.ingress.admission", logging.INFO) as lines:
            admission.settle(done)  # the owner is away (killed, restarting)
            await lines.wait_for("settles not acknowledged", 1, WAIT)
        assert admission.owed == 1
        actor = LimitsActor(str(tmp_path / "limits.db"), LimitsConfig(snapshot_seconds=0.05))
        async with (
            bus.subscribe(subjects.LIMITS_SETTLE) as settles,  # sees it; the owner answers
            anyio.create_task_group() as tg,
        ):
            await tg.start(actor.run, bus)
            with anyio.fail_after(WAIT):  # paid at the next renewal tick
                paid = (await anext(aiter(settles))).message
            assert paid == done
            assert admission.owed == 0
            usage = await _usage(bus)
            actor.request_stop()
    finally:
        await admission.aclose()
        await bus.aclose()
    assert usage["spent_usd"] == 0.25
