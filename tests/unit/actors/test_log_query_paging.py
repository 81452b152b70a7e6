"""``llmgw replay --url|--bus`` reads a running gateway's request log a page at a time from its
owner (the StoreActor's ``log query``): every row once, whatever the page size, rows sharing a
timestamp across a page's edge included; each request at the size of the attempt that served
it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from actors import StoreActor
from gateway.admin.http import admin_request
from gateway.cli.replay_log import _collect as collect_trace
from gateway.cli.replay_log import logged_rows
from schemas import LogAppend, LogAppended, Observation, RequestCompleted, subjects
from schemas.config import LogConfig
from tests.unit.actors import WAIT

if TYPE_CHECKING:
    from bus import InProcessBus
    from tests.unit.actors.log_databases import LogDatabase

TIMES = (1.0, 2.0, 3.0, 3.0, 4.0, 5.0, 6.0)  # two share the time a page ends at


async def test_every_logged_request_comes_once_across_pages(
    bus: InProcessBus, log_db: LogDatabase
) -> None:
    store = StoreActor(log_db.config, LogConfig(flush_ms=10))
    done = [RequestCompleted(request_id=f"r{i}", model="m", ts=t) for i, t in enumerate(TIMES)]

    async def ask(area: str, verb: str, args: dict[str, Any]) -> dict[str, Any]:
        return await admin_request(bus, area, verb, args, by="test", timeout=WAIT)

    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        stored = await bus.request(
            subjects.LOG_APPEND,
            LogAppend(sender="ing-1", seq=1, requests=tuple(done), attempts=()),
            reply_type=LogAppended,
            timeout=WAIT,
        )  # answered once committed
        paged = await logged_rows(ask, since=0.0, page_rows=3)
        whole = await logged_rows(ask, since=0.0)
        store.request_stop()
    assert stored == LogAppended(seq=1)
    assert [r["request_id"] for r in paged] == [r["request_id"] for r in whole]
    assert sorted(r["request_id"] for r in paged) == [f"r{i}" for i in range(len(TIMES))]
    assert [r["ts"] for r in paged] == sorted(TIMES)


async def test_a_failed_over_request_replays_at_the_size_of_the_attempt_that_served_it(
    bus: InProcessBus, log_db: LogDatabase
) -> None:
    # Its request row counts both attempts' tokens (17 and 10), as its cost does: replayed
    # from that row alone, it would ask for more than the client did.
    store = StoreActor(log_db.config, LogConfig(flush_ms=10))
    refused = Observation(
        endpoint="m:a", model="m", outcome="client_error", request_id="r1", ts=1.0,
        prompt_tokens=7, completion_tokens=5,
    )  # fmt: skip
    served = Observation(
        endpoint="m:b", model="m", outcome="success", attempt=2, request_id="r1", ts=2.0,
        prompt_tokens=10, completion_tokens=5,
    )  # fmt: skip
    done = RequestCompleted(
        request_id="r1", model="m", requested_model="m", ts=2.0, attempts=2,
        prompt_tokens=17, completion_tokens=10,
    )  # fmt: skip

    async def ask(area: str, verb: str, args: dict[str, Any]) -> dict[str, Any]:
        return await admin_request(bus, area, verb, args, by="test", timeout=WAIT)

    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        await bus.request(
            subjects.LOG_APPEND,
            LogAppend(sender="ing-1", seq=1, requests=(done,), attempts=(refused, served)),
            reply_type=LogAppended,
            timeout=WAIT,
        )  # answered once committed
        trace, keys = await collect_trace(ask, 0.0)
        store.request_stop()
    assert keys == []
    assert [(r.id, r.prompt_tokens, r.output_tokens) for r in trace] == [("r1", 10, 5)]
