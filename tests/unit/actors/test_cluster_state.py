"""The gateway API keys, limits and budgets of a cluster live in their unit's snapshots: what
an owner answered is saved before the answer, so a host taking over from it at that instant
(here: a second owner on its own bus, loading the same store while the first still runs, as
after a kill -9) knows every key and limit and holds every count and running lease."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from actors.apikey_admin import ApiKeyAdminActor
from actors.cluster import OWNERS_BUCKET, SNAPSHOTS_BUCKET, FencedSnapshots, Owners
from actors.limits import LimitsActor
from actors.stores.limits_snapshot import SnapshotLimits
from actors.stores.snapshots import SnapshotStore
from bus import InProcessBus
from schemas import AdminCommand, AdminReply, ApiKeyInfo, ApiKeyLookup, subjects
from schemas.keys import hash_key
from schemas.limits import AdmitReply, AdmitRequest, LimitsConfig, LimitSettle
from tests.unit.actors import WAIT, FakeClock
from tests.unit.actors.cluster_support import CuttableBus

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from actors.base import Actor

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()
# No timer saves during a test: only what is saved before an answer can be found.
SETTINGS = LimitsConfig(lease_ttl_seconds=30, snapshot_seconds=3600)
KEY = ("key:k-1",)
NOT_YET = 0.2  # how long a test watches for an answer that must not come yet


@pytest.fixture
async def state(tmp_path: Path) -> AsyncIterator[SnapshotStore]:
    store = await SnapshotStore.open(tmp_path / "state.db")
    yield store
    await store.aclose()


async def _admin(bus: InProcessBus, area: str, verb: str, **args: Any) -> dict[str, Any]:
    reply = await bus.request(
        subjects.admin(area, verb),
        AdminCommand(args=args, by="t"),
        reply_type=AdminReply,
        timeout=WAIT,
    )
    assert isinstance(reply, AdminReply), reply
    return reply.result


async def _admit(bus: InProcessBus, rid: str, cost: float = 0.0) -> AdmitReply:
    reply = await bus.request(
        subjects.LIMITS_ADMIT,
        AdmitRequest(request_id=rid, ingress="i-1", subjects=KEY, role="pro", cost_usd=cost),
        reply_type=AdmitReply,
        timeout=WAIT,
    )
    assert isinstance(reply, AdmitReply), reply
    return reply


async def _settle(bus: InProcessBus, rid: str, cost: float) -> None:
    done = LimitSettle(request_id=rid, subjects=KEY, role="pro", cost_usd=cost)
    ack = await bus.request(subjects.LIMITS_SETTLE, done, reply_type=AdmitReply, timeout=WAIT)
    assert ack == AdmitReply(admitted=True)


async def _running(actor: Actor, bus: InProcessBus, tg: anyio.abc.TaskGroup) -> None:
    await tg.start(actor.run, bus)


async def test_a_limits_owner_taking_over_holds_the_counts_leases_and_budget_answered(
    tmp_path: Path, state: SnapshotStore
) -> None:
    clock = FakeClock()
    clock.now = T0
    old_bus, new_bus = InProcessBus(), InProcessBus()
    async with anyio.create_task_group() as tg:
        old = LimitsActor(str(tmp_path / "old"), SETTINGS, clock=clock, state=state)
        await _running(old, old_bus, tg)
        await _admin(
            old_bus, "limits", "set", kind="key", id="k-1", rpm=3, concurrency=2, budget="1/day"
        )
        assert (await _admit(old_bus, "spent", cost=0.5)).admitted
        await _settle(old_bus, "spent", 0.75)
        assert (await _admit(old_bus, "running", cost=0.1)).admitted
        # Taken over now: the old owner still runs and saved nothing on a timer.
        new = LimitsActor(str(tmp_path / "new"), SETTINGS, clock=clock, state=state)
        await _running(new, new_bus, tg)
        got = await _admin(new_bus, "limits", "get", subject="key:k-1")
        over_budget = await _admit(new_bus, "dear", cost=0.2)  # 0.75 + 0.1 held + 0.2 > 1
        await _settle(new_bus, "running", 0.1)  # the running lease, settled on the new owner
        third = await _admit(new_bus, "third")
        over_rpm = await _admit(new_bus, "fourth")
        await _settle(new_bus, "spent", 0.75)  # sent again: its answer was lost in the kill
        after = await _admin(new_bus, "limits", "get", subject="key:k-1")
        old.request_stop()
        new.request_stop()
    await old_bus.aclose()
    await new_bus.aclose()

    assert got["limit"] == {"rpm": 3, "concurrency": 2, "budget_usd": 1.0, "budget_period": "day"}
    assert got["usage"]["requests_last_minute"] == 2
    assert got["usage"]["in_flight"] == 1
    assert got["usage"]["spent_usd"] == pytest.approx(0.75)
    assert over_budget.code == "budget_exceeded"
    assert third.admitted and over_rpm.code == "rate_limited"
    assert after["usage"]["spent_usd"] == pytest.approx(0.85)  # the resent settle once
    assert after["usage"]["in_flight"] == 1  # "third" only: "running" freed its slot


async def test_a_keys_owner_taking_over_knows_every_key_created_and_revoked(
    tmp_path: Path, state: SnapshotStore
) -> None:
    old_bus, new_bus = InProcessBus(), InProcessBus()
    async with anyio.create_task_group() as tg:
        old = ApiKeyAdminActor(str(tmp_path / "old.db"), state=state)
        await _running(old, old_bus, tg)
        kept = await _admin(old_bus, "api_keys", "create", org="acme", user="al", role="pro")
        gone = await _admin(old_bus, "api_keys", "create", org="acme", user="bo", role="free")
        await _admin(old_bus, "api_keys", "revoke", id=gone["id"])
        new = ApiKeyAdminActor(str(tmp_path / "new.db"), state=state)
        await _running(new, new_bus, tg)
        found = await new_bus.request(
            subjects.AUTH_KEYS_LOOKUP,
            ApiKeyLookup(key_hash=hash_key(kept["key"])),
            reply_type=ApiKeyInfo,
            timeout=WAIT,
        )
        listed = await _admin(new_bus, "api_keys", "list")
        old.request_stop()
        new.request_stop()
    await old_bus.aclose()
    await new_bus.aclose()

    assert isinstance(found, ApiKeyInfo) and found.found
    assert (found.key_id, found.role, found.org, found.user) == (kept["id"], "pro", "acme", "al")
    assert [(k["id"], k["status"]) for k in listed["data"]] == [
        (kept["id"], "active"),
        (gone["id"], "revoked"),
    ]
    assert not (tmp_path / "old.db").exists()  # nothing in the host's own file


async def test_an_admission_is_answered_only_once_jetstream_holds_it(tmp_path: Path) -> None:
    """The cluster's snapshots are written behind the actors: an admission must still wait
    for its write (a bucket electing its leader takes none), or a kill right after the
    answer would lose what it counted."""
    clock = FakeClock()
    clock.now = T0
    shared, bus = InProcessBus(), InProcessBus()
    gated = CuttableBus(shared)
    owners = Owners(await gated.key_value(OWNERS_BUCKET))
    lease = await owners.claim("limits", "host-a", ["host-a"])
    assert lease is not None
    kv = await gated.key_value(SNAPSHOTS_BUCKET)
    store = FencedSnapshots(kv, owners, lease, on_lost=lambda: None)
    async with anyio.create_task_group() as tg:
        actor = LimitsActor(str(tmp_path / "db"), SETTINGS, clock=clock, state=store)
        await _running(actor, bus, tg)
        await _admin(bus, "limits", "set", kind="key", id="k-1", rpm=3)
        gated.gates[SNAPSHOTS_BUCKET].clear()  # JetStream takes no write for now
        answer: list[AdmitReply] = []
        answered = anyio.Event()

        async def admit() -> None:
            answer.append(await _admit(bus, "r1"))
            answered.set()

        tg.start_soon(admit)
        with anyio.move_on_after(NOT_YET):
            await answered.wait()
        unanswered = not answer
        gated.gates[SNAPSHOTS_BUCKET].set()
        with anyio.fail_after(WAIT):
            await answered.wait()  # the write lands, then the answer
        # Taken over at this instant by a host that sees host-a gone.
        new_owners = Owners(await shared.key_value(OWNERS_BUCKET))
        new_lease = await new_owners.claim("limits", "host-b", ["host-b"])
        assert new_lease is not None
        new_kv = await shared.key_value(SNAPSHOTS_BUCKET)
        taken = FencedSnapshots(new_kv, new_owners, new_lease, on_lost=lambda: None)
        loaded = await SnapshotLimits(taken).load(0.0)
        actor.request_stop()
    await taken.aclose()
    await store.aclose()
    await gated.aclose()
    await shared.aclose()
    await bus.aclose()

    assert unanswered and answer[0].admitted
    assert [lease.request_id for lease in loaded.leases] == ["r1"]
    assert sum(n for _, n in loaded.counters["key:k-1"].requests) == 1
