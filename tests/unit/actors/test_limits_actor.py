"""LimitsActor on the in-process bus with an injected clock: a lease its ingress stops
renewing is released on its own, a renewed one is kept, settles reconcile, budgets announce
their thresholds, limits and counters outlive the actor."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from actors import ChildSpec, admin, build_tree
from actors.limits import LimitsActor
from actors.reconfigure import apply, diff
from schemas import (
    AdminCommand,
    AdminExecuted,
    AdminReply,
    ApiKeyInfo,
    ApiKeyLookup,
    ErrorReply,
    subjects,
)
from schemas.config import GatewayConfig
from schemas.limits import (
    AdmitReply,
    AdmitRequest,
    BudgetThreshold,
    LeaseExpired,
    LimitRenew,
    LimitsConfig,
    LimitSettle,
    LimitSettleBatch,
)
from tests.unit.actors import WAIT, FakeClock

if TYPE_CHECKING:
    from pathlib import Path

    from bus import Envelope, InProcessBus

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()
SETTINGS = LimitsConfig(lease_ttl_seconds=30, snapshot_seconds=3600)
KEY = ("key:k-1", "org:acme")


async def _admin(bus: InProcessBus, verb: str, **args: Any) -> dict[str, Any]:
    reply = await bus.request(
        subjects.admin("limits", verb),
        AdminCommand(args=args, by="t"),
        reply_type=AdminReply,
        timeout=WAIT,
    )
    assert isinstance(reply, AdminReply), reply
    return reply.result


async def _admit(bus: InProcessBus, rid: str, tokens: int = 0, cost: float = 0.0) -> AdmitReply:
    reply = await bus.request(
        subjects.LIMITS_ADMIT,
        AdmitRequest(
            request_id=rid, ingress="i-1", subjects=KEY, role="pro", tokens=tokens, cost_usd=cost
        ),
        reply_type=AdmitReply,
        timeout=WAIT,
    )
    assert isinstance(reply, AdmitReply), reply
    return reply


@pytest.fixture
def clock() -> FakeClock:
    c = FakeClock()
    c.now = T0
    return c


async def test_a_lease_not_renewed_expires_and_a_renewed_one_is_kept(
    bus: InProcessBus,
    tmp_path: Path,
    clock: FakeClock,
) -> None:
    actor = LimitsActor(str(tmp_path / "db"), SETTINGS, clock=clock)
    async with anyio.create_task_group() as tg, bus.subscribe(subjects.event("limits")) as ev:
        await tg.start(actor.run, bus)
        await _admin(bus, "set", kind="key", id="k-1", concurrency=2)
        assert (await _admit(bus, "dead")).admitted
        assert (await _admit(bus, "alive")).admitted
        assert not (await _admit(bus, "third")).admitted
        clock.now += 20
        await bus.publish(subjects.LIMITS_RENEW, LimitRenew(ingress="i-1", request_ids=("alive",)))
        clock.now += 15  # "dead" was last renewed 35 s ago, "alive" 15 s ago
        assert (await _admit(bus, "fourth")).admitted
        assert not (await _admit(bus, "fifth")).admitted  # "alive" still holds its slot
        with anyio.fail_after(WAIT):
            expired = (await anext(aiter(ev))).message
        assert isinstance(expired, LeaseExpired)
        assert (expired.request_id, expired.ingress) == ("dead", "i-1")
        usage = (await _admin(bus, "get", subject="key:k-1"))["usage"]
        assert usage["in_flight"] == 2
        actor.request_stop()


async def test_settle_reconciles_tokens_and_budget_events_fire_once_per_period(
    bus: InProcessBus,
    tmp_path: Path,
    clock: FakeClock,
) -> None:
    actor = LimitsActor(str(tmp_path / "db"), SETTINGS, clock=clock)
    async with anyio.create_task_group() as tg, bus.subscribe(subjects.event("budget")) as ev:
        await tg.start(actor.run, bus)
        await _admin(bus, "set", kind="org", id="acme", budget="1/day", soft_fraction=0.5, tpm=1000)
        reply = await _admit(bus, "r1", tokens=800, cost=0.3)
        assert reply.admitted and reply.remaining_tokens == 200
        await bus.publish(
            subjects.LIMITS_SETTLE, LimitSettle(request_id="r1", tokens=40, cost_usd=0.6)
        )
        with anyio.fail_after(WAIT):
            first = (await anext(aiter(ev))).message
        assert isinstance(first, BudgetThreshold) and not first.exhausted
        assert first.period == "2026-12-01" and first.spent_usd == pytest.approx(0.6)
        assert (await _admit(bus, "r2", tokens=900)).admitted  # 40 + 900 fits now
        await bus.publish(subjects.LIMITS_SETTLE, LimitSettle(request_id="r2", cost_usd=0.5))
        with anyio.fail_after(WAIT):
            spent = (await anext(aiter(ev))).message
        assert isinstance(spent, BudgetThreshold) and spent.exhausted
        refused = await _admit(bus, "r3")
        assert refused.code == "budget_exceeded"
        assert refused.retry_after == pytest.approx(12 * 3600)  # until midnight UTC
        actor.request_stop()


async def test_a_settle_after_its_lease_expired_replaces_the_reservation_counted(
    bus: InProcessBus,
    tmp_path: Path,
    clock: FakeClock,
) -> None:
    # The expiry counted the reservation ($1, 1,000 tokens), then the settle its ingress
    # sent once it reached the owner again was counted on top: $1.20 spent for $0.20 used.
    actor = LimitsActor(str(tmp_path / "db"), SETTINGS, clock=clock)
    async with anyio.create_task_group() as tg:
        await tg.start(actor.run, bus)
        await _admin(bus, "set", kind="key", id="k-1", budget="10/day", tpm=100_000)
        assert (await _admit(bus, "r1", tokens=1000, cost=1.0)).admitted
        clock.now += 35  # not renewed for longer than the TTL (a partition, a slow takeover)
        assert (await _admit(bus, "r2")).admitted  # expiries run with admissions
        usage = (await _admin(bus, "get", subject="key:k-1"))["usage"]
        assert usage["spent_usd"] == pytest.approx(1.0)  # counted at its reservation
        late = LimitSettle(request_id="r1", subjects=KEY, role="pro", tokens=100, cost_usd=0.2)
        await bus.publish(subjects.LIMITS_SETTLE, late)
        await bus.publish(subjects.LIMITS_SETTLE, late)  # and sent again: counted once
        usage = (await _admin(bus, "get", subject="key:k-1"))["usage"]
        assert usage["spent_usd"] == pytest.approx(0.2)
        assert usage["tokens_last_minute"] == 100
        actor.request_stop()


async def test_amounts_no_counter_can_hold_are_refused_or_ignored_and_the_actor_lives(
    bus: InProcessBus,
    tmp_path: Path,
    clock: FakeClock,
) -> None:
    # A 10**400-token reservation overflowed the counters' float arithmetic: the actor
    # crashed on every such request.
    actor = LimitsActor(str(tmp_path / "db"), SETTINGS, clock=clock)
    async with anyio.create_task_group() as tg:
        await tg.start(actor.run, bus)
        await _admin(bus, "set", kind="org", id="acme", budget="1/day", tpm=1000)

        huge = await _admit(bus, "huge", tokens=10**400)
        assert not huge.admitted and huge.code == "rate_limited"
        assert (await _admit(bus, "r1", tokens=10, cost=0.1)).admitted
        await bus.publish(
            subjects.LIMITS_SETTLE,
            LimitSettle(request_id="r1", tokens=-(10**400), cost_usd=-1.0),
        )
        # Read after the settle: one mailbox, in order.
        usage = (await _admin(bus, "get", subject="org:acme"))["usage"]
        assert usage["spent_usd"] == 0.0 and usage["tokens_last_minute"] == 0
        assert (await _admit(bus, "r2", tokens=900, cost=0.9)).admitted
        actor.request_stop()


async def test_limits_and_counters_outlive_the_actor(
    bus: InProcessBus,
    tmp_path: Path,
    clock: FakeClock,
) -> None:
    path = str(tmp_path / "db")
    async with anyio.create_task_group() as tg:
        first = LimitsActor(path, SETTINGS, clock=clock)
        await tg.start(first.run, bus)
        await _admin(bus, "set", subject="user:acme/alice", rpm=1)
        await bus.request(
            subjects.LIMITS_ADMIT,
            AdmitRequest(
                request_id="r1", ingress="i", subjects=("key:k-9", "org:acme", "user:acme/alice")
            ),
            reply_type=AdmitReply,
            timeout=WAIT,
        )
        first.request_stop()
    async with anyio.create_task_group() as tg:
        second = LimitsActor(path, SETTINGS, clock=clock)
        await tg.start(second.run, bus)
        got = await _admin(bus, "get", subject="user:acme/alice")
        assert got["limit"] == {"rpm": 1}
        assert got["usage"]["requests_last_minute"] == 1
        refused = await bus.request(
            subjects.LIMITS_ADMIT,
            AdmitRequest(request_id="r2", ingress="i", subjects=("user:acme/alice",)),
            reply_type=AdmitReply,
            timeout=WAIT,
        )
        assert isinstance(refused, AdmitReply) and refused.code == "rate_limited"
        second.request_stop()


async def test_a_replaced_owner_carries_on_the_counters_of_the_one_it_replaced(
    bus: InProcessBus,
    tmp_path: Path,
    clock: FakeClock,
) -> None:
    """A reload that changes the owner's settings swaps it break before make: the old one
    saves its counters on stop and the new one loads them, so the window is not reset (with
    make before break the new owner would start from an older snapshot while the old one
    still admitted)."""
    db = str(tmp_path / "db")
    config = GatewayConfig.model_validate({"database": {"path": db}, "models": []})
    reloaded = config.model_copy(
        update={"limits": config.limits.model_copy(update={"snapshot_seconds": 7200.0})}
    )
    root = build_tree(config, clock=clock)
    changes = diff(root, build_tree(reloaded, clock=clock))
    assert [(c.kind, c.name) for c in changes] == [("replace", "limits")]
    spec = changes[0].new
    assert isinstance(spec, ChildSpec) and spec.exclusive
    await root.start(bus)
    try:
        # The org, not the key: the tree's key owner knows no key k-1 and refuses its limit.
        await _admin(bus, "set", kind="org", id="acme", rpm=1)
        assert (await _admit(bus, "first")).admitted
        await apply(root, changes, [])
        assert not (await _admit(bus, "second")).admitted  # the minute's request still counts
    finally:
        await root.stop()


async def test_a_settle_sent_again_is_acknowledged_once_saved_and_counted_once(
    bus: InProcessBus,
    tmp_path: Path,
    clock: FakeClock,
) -> None:
    settings = LimitsConfig(lease_ttl_seconds=30, snapshot_seconds=0.05)
    settles = LimitSettleBatch(
        settles=(
            LimitSettle(request_id="r1", subjects=KEY, role="pro", cost_usd=0.25),
            # a lease the owner never saw (it restarted): counted when its settle arrives
            LimitSettle(request_id="r0", subjects=KEY, role="pro", cost_usd=0.5),
        )
    )
    acks, spent = [], []
    for run in range(2):  # the second owner is a restart: it knows the ids from the file
        actor = LimitsActor(str(tmp_path / "db"), settings, clock=clock)
        async with anyio.create_task_group() as tg:
            await tg.start(actor.run, bus)
            if run == 0:
                await _admin(bus, "set", kind="key", id="k-1", budget="10/day")
                assert (await _admit(bus, "r1", cost=0.1)).admitted
            for _ in range(2):  # as after a lost acknowledgement: the same batch again
                acks.append(
                    await bus.request(
                        subjects.LIMITS_SETTLE, settles, reply_type=AdmitReply, timeout=WAIT
                    )
                )
            spent.append((await _admin(bus, "get", subject="key:k-1"))["usage"]["spent_usd"])
            actor.request_stop()
    assert acks == [AdmitReply(admitted=True)] * 4
    assert spent == [pytest.approx(0.75)] * 2


@pytest.mark.parametrize("found", [True, False])
async def test_admissions_are_answered_while_a_key_limit_waits_for_the_keys_owner(
    bus: InProcessBus,
    tmp_path: Path,
    clock: FakeClock,
    found: bool,
) -> None:
    """The key check of ``limits set key:<id>`` asked the keys' owner inside the mailbox: a
    slow owner (its SQLite busy) held every admission of the gateway for up to 2 s."""
    actor = LimitsActor(str(tmp_path / "db"), SETTINGS, clock=clock)
    answered: list[str] = []
    asked: list[Envelope] = []
    lookup_pending, admin_answered = anyio.Event(), anyio.Event()
    set_reply: list[object] = []

    async def keys_owner() -> None:  # the test answers, once it has been admitted
        asked.append(await anext(aiter(owner)))
        lookup_pending.set()

    async def set_limit() -> None:
        set_reply.append(
            await bus.request(
                subjects.admin("limits", "set"),
                AdminCommand(args={"kind": "key", "id": "k-1", "rpm": 1}, by="t"),
                reply_type=AdminReply,
                timeout=WAIT,
            )
        )
        answered.append("set")
        admin_answered.set()

    async with (
        anyio.create_task_group() as tg,
        bus.subscribe(subjects.AUTH_KEYS_LOOKUP) as owner,
        bus.subscribe(subjects.event("admin")) as audit,
    ):
        await tg.start(actor.run, bus)
        tg.start_soon(keys_owner)
        tg.start_soon(set_limit)
        with anyio.fail_after(WAIT):
            await lookup_pending.wait()  # the actor took the command and asked
        assert (await _admit(bus, "before")).admitted  # no limit yet
        answered.append("admit")
        (lookup,) = asked
        assert isinstance(lookup.message, ApiKeyLookup) and lookup.message.key_id == "k-1"
        await lookup.respond(ApiKeyInfo(found=found, key_id="k-1" if found else ""))
        with anyio.fail_after(WAIT):
            await admin_answered.wait()
            event = (await anext(aiter(audit))).message
        limits = (await _admin(bus, "get"))["limits"]
        second, third = await _admit(bus, "second"), await _admit(bus, "third")
        actor.request_stop()

    assert answered == ["admit", "set"]
    assert isinstance(event, AdminExecuted) and (event.area, event.verb) == ("limits", "set")
    if found:
        assert set_reply == [AdminReply(result={"subject": "key:k-1", "limit": {"rpm": 1}})]
        assert limits == {"key:k-1": {"rpm": 1}} and event.ok
        assert second.admitted and not third.admitted
    else:
        message = "no gateway API key 'k-1' (`llmgw keys list` shows the ids)"
        assert set_reply == [ErrorReply(code="route_not_found", message=message)]
        assert limits == {} and (event.ok, event.message) == (False, message)
        assert second.admitted and third.admitted


async def test_a_key_limit_waiting_on_its_check_is_answered_when_the_owner_stops(
    bus: InProcessBus, tmp_path: Path, clock: FakeClock
) -> None:
    """Its check runs off the mailbox: an owner stopping meanwhile (a reload, a unit moving)
    cancelled it unanswered, and the caller waited out its timeout for "outcome unknown"."""
    actor = LimitsActor(str(tmp_path / "db"), SETTINGS, clock=clock)
    replies: list[object] = []
    answered = anyio.Event()

    async def set_limit() -> None:
        command = AdminCommand(args={"kind": "key", "id": "k-1", "rpm": 1}, by="t")
        replies.append(
            await bus.request(
                subjects.admin("limits", "set"), command, reply_type=AdminReply, timeout=WAIT
            )
        )
        answered.set()

    async with anyio.create_task_group() as tg, bus.subscribe(subjects.AUTH_KEYS_LOOKUP) as owner:
        await tg.start(actor.run, bus)
        tg.start_soon(set_limit)
        with anyio.fail_after(WAIT):
            await anext(aiter(owner))  # asked, and never answered
            actor.request_stop()
            await answered.wait()

    (reply,) = replies
    assert isinstance(reply, ErrorReply) and reply.code == "no_responders", reply
    assert "stopped before running set: nothing was changed" in reply.message


async def test_key_limits_waiting_on_their_checks_are_bounded(
    bus: InProcessBus, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each check's question is a task: past the bound, a command is refused (retry), never
    one more task held on a keys' owner that does not answer."""
    monkeypatch.setattr(admin, "MAX_CHECKS_IN_FLIGHT", 1)
    actor = LimitsActor(str(tmp_path / "db"), SETTINGS, clock=clock)

    async def set_limit(key_id: str) -> object:
        command = AdminCommand(args={"kind": "key", "id": key_id, "rpm": 1}, by="t")
        return await bus.request(
            subjects.admin("limits", "set"), command, reply_type=AdminReply, timeout=WAIT
        )

    first: list[object] = []
    first_answered = anyio.Event()

    async def set_first() -> None:
        first.append(await set_limit("k-1"))
        first_answered.set()

    async with anyio.create_task_group() as tg, bus.subscribe(subjects.AUTH_KEYS_LOOKUP) as owner:
        await tg.start(actor.run, bus)
        tg.start_soon(set_first)
        with anyio.fail_after(WAIT):
            lookup = await anext(aiter(owner))  # k-1's question is out
            refused = await set_limit("k-2")
            await lookup.respond(ApiKeyInfo(found=True, key_id="k-1"))
            await first_answered.wait()
        actor.request_stop()

    assert isinstance(refused, ErrorReply) and refused.code == "no_responders", refused
    assert "1 admin commands waiting on their checks" in refused.message
    assert first == [AdminReply(result={"subject": "key:k-1", "limit": {"rpm": 1}})]
