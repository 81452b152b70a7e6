"""``spend report`` from the StoreActor: whole hours from the hourly aggregates, the
partial hours at the edges from the log; the aggregates of an older log are built at start."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from actors import StoreActor
from schemas import AdminCommand, AdminReply, RequestCompleted, subjects
from schemas.config import LogConfig
from tests.unit.actors import WAIT, log

if TYPE_CHECKING:
    from pathlib import Path

    from bus import InProcessBus
    from tests.unit.actors.log_databases import LogDatabase

H = 3600.0
T = 1_800_000_000.0 - 1_800_000_000.0 % H  # an hour boundary


async def _report(bus: InProcessBus, **args: Any) -> dict[str, Any]:
    reply = await bus.request(
        subjects.admin("spend", "report"),
        AdminCommand(args=args),
        reply_type=AdminReply,
        timeout=WAIT,
    )
    assert isinstance(reply, AdminReply), reply
    return reply.result


def _done(ts: float, key: str, usd: float, *, estimated: bool = False) -> RequestCompleted:
    return RequestCompleted(
        request_id=f"r{ts}",
        ts=ts,
        model="m",
        key_id=key,
        org="acme",
        user="alice",
        prompt_tokens=10,
        completion_tokens=5,
        cost_usd=usd,
        cost_estimated=estimated,
    )


async def test_a_report_adds_whole_hours_from_aggregates_and_the_edges_from_the_log(
    bus: InProcessBus,
    log_db: LogDatabase,
) -> None:
    store = StoreActor(log_db.config, LogConfig(flush_ms=10_000), clock=lambda: T + 10 * H)
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        # 0.5 h before the range, in its first partial hour, two whole hours, the last
        # partial hour, and after it.
        for ts, usd in (
            (T - 0.5 * H, 100.0),
            (T + 0.75 * H, 1.0),
            (T + 1.5 * H, 2.0),
            (T + 2.25 * H, 4.0),
            (T + 3.1 * H, 8.0),
            (T + 3.9 * H, 200.0),
        ):
            await log(bus, _done(ts, "gk-a", usd))
        await log(bus, _done(T + 1.2 * H, "gk-b", 16.0, estimated=True))
        got = await _report(bus, since=T + 0.5 * H, until=T + 3.5 * H, group_by="key")
        whole = await _report(bus, since=T + 0.6 * H, until=T + 0.8 * H, group_by="org")
        store.request_stop()
    assert got["total_usd"] == pytest.approx(31.0)
    assert got["groups"] == [
        {
            "key": "gk-b",
            "requests": 1,
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "cost_usd": 16.0,
            "estimated_requests": 1,
        },
        {
            "key": "gk-a",
            "requests": 4,
            "prompt_tokens": 40,
            "completion_tokens": 20,
            "cost_usd": 15.0,
            "estimated_requests": 0,
        },
    ]
    assert whole["groups"][0]["cost_usd"] == 1.0  # inside one hour: from the log alone
    (hours,) = await log_db.fetch("SELECT COUNT(*) AS n, SUM(requests) AS r FROM spend_hourly")
    assert (hours["n"], hours["r"]) == (6, 7)


async def test_the_aggregates_of_a_log_written_before_them_are_built_at_start(
    bus: InProcessBus,
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.db"
    for _ in range(2):  # the second start must not count the rows twice
        store = StoreActor(str(path), LogConfig(flush_ms=10_000), clock=lambda: T + 10 * H)
        async with anyio.create_task_group() as tg:
            await tg.start(store.run, bus)
            if _ == 0:
                await log(bus, _done(T + 1.5 * H, "gk-a", 2.0))
            store.request_stop()
        if _ == 0:
            with sqlite3.connect(path) as db:
                db.execute("DROP TABLE spend_hourly")  # as a file from before them
    store = StoreActor(str(path), LogConfig(flush_ms=10_000), clock=lambda: T + 10 * H)
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        got = await _report(bus, since=T, until=T + 5 * H)
        store.request_stop()
    assert [(g["model"], g["requests"], g["cost_usd"]) for g in got["groups"]] == [("m", 1, 2.0)]


async def test_a_report_per_day_splits_each_group_by_utc_day_aggregates_and_edges_alike(
    bus: InProcessBus,
    log_db: LogDatabase,
) -> None:
    day = 86_400.0
    d = T - T % day  # a UTC midnight
    store = StoreActor(log_db.config, LogConfig(flush_ms=10_000), clock=lambda: d + day)
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        # The first partial hour (log), whole hours on both sides of midnight (aggregates),
        # and the last partial hour (log).
        for ts, key, usd in (
            (d - 2.1 * H, "gk-a", 1.0),
            (d - 1.5 * H, "gk-a", 2.0),
            (d + 0.5 * H, "gk-a", 4.0),
            (d + 0.7 * H, "gk-b", 8.0),
            (d + 5.2 * H, "gk-b", 16.0),
        ):
            await log(bus, _done(ts, key, usd))
        got = await _report(
            bus, since=d - 2.25 * H, until=d + 5.5 * H, group_by="key", per_day=True
        )
        plain = await _report(bus, since=d - 2.25 * H, until=d + 5.5 * H, group_by="key")
        store.request_stop()
    assert [(x["day"], x["key"], x["cost_usd"], x["requests"]) for x in got["days"]] == [
        (d - day, "gk-a", 3.0, 2),
        (d, "gk-a", 4.0, 1),
        (d, "gk-b", 24.0, 2),
    ]
    assert got["groups"] == plain["groups"] and "days" not in plain
