"""LogOutbox: an ingress keeps request-log rows until the store acknowledges them committed,
sends them again while no store answers, and bounds what it keeps."""

from __future__ import annotations

import logging
import sqlite3
import time
from typing import TYPE_CHECKING

import anyio

from actors import StoreActor
from bus import InProcessBus
from gateway.ingress.accounting import LogOutbox
from gateway.ingress.metrics import GatewayMetrics
from schemas import Observation, RequestCompleted, subjects
from schemas.config import LogConfig
from tests.fixtures.logs import LogLines, log_lines

if TYPE_CHECKING:
    from pathlib import Path

WAIT = 10.0  # the outbox sends again every RETRY_S; this bounds a few rounds on a busy host


def _request(i: int) -> tuple[RequestCompleted, tuple[Observation, ...]]:
    done = RequestCompleted(request_id=f"r{i}", model="m", cost_usd=0.01, ts=time.time())
    attempt = Observation(endpoint="m:a", model="m", outcome="success", request_id=f"r{i}")
    return done, (attempt,)


def _kinds(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as db:
        return list(
            db.execute("SELECT request_id, kind FROM request_log ORDER BY request_id, kind")
        )


async def _failed_twice(outbox: LogOutbox, lines: LogLines) -> None:
    """Return once the outbox sent its batch and got no answer twice (it warns at the first
    and second failure); fail after WAIT."""
    await lines.wait_for("rows kept for the store until it answers", 2, WAIT)
    assert outbox.failures >= 2


async def _drained(outbox: LogOutbox) -> None:
    with anyio.fail_after(WAIT):
        await outbox.drained()


async def test_rows_kept_while_no_store_runs_are_committed_once_one_starts(tmp_path: Path) -> None:
    bus = InProcessBus()
    outbox = LogOutbox(bus, LogConfig(flush_ms=10))
    path = tmp_path / "log.db"
    try:
        with log_lines("gateway.ingress.accounting", logging.WARNING) as lines:
            outbox.start()
            for i in range(3):
                outbox.add(*_request(i))
            await _failed_twice(outbox, lines)
        kept = outbox.waiting
        store = StoreActor(str(path), LogConfig(flush_ms=10))
        async with anyio.create_task_group() as tg:
            await tg.start(store.run, bus)
            await _drained(outbox)  # acknowledged once committed
            outbox.add(*_request(3))  # the store is back: a new request goes straight through
            await _drained(outbox)
            store.request_stop()
    finally:
        await outbox.aclose()
        await bus.aclose()
    assert kept == 6
    assert _kinds(path) == [(f"r{i}", kind) for i in range(4) for kind in ("attempt", "request")]


async def test_a_full_outbox_drops_and_counts_new_rows_never_blocking() -> None:
    bus = InProcessBus()
    outbox = LogOutbox(bus, LogConfig(batch_rows=1, queue_rows=5))  # not started: nothing sent
    try:
        for i in range(3):  # two rows each: the third does not fit
            outbox.add(*_request(i))
    finally:
        await bus.aclose()
    assert (outbox.waiting, outbox.dropped) == (4, 2)


async def test_a_clean_stop_with_no_store_answering_ends_at_once() -> None:
    bus = InProcessBus()
    outbox = LogOutbox(bus, LogConfig())
    outbox.start()
    outbox.add(*_request(1))
    try:
        with anyio.fail_after(WAIT):
            await outbox.aclose(wait=60.0)  # no responders: no point waiting the whole minute
    finally:
        await bus.aclose()
    assert outbox.waiting == 2


async def test_rows_a_full_outbox_dropped_are_exported_as_a_metric() -> None:
    bus = InProcessBus()
    metrics = GatewayMetrics()
    outbox = LogOutbox(bus, LogConfig(batch_rows=1, queue_rows=2))
    metrics.count_log_drops(lambda: outbox.dropped)
    try:
        for i in range(2):
            outbox.add(*_request(i))
    finally:
        await bus.aclose()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metrics.registry.collect()
        for s in family.samples
    }
    assert samples[("llmgw_log_rows_dropped_total", (("cause", "ingress_full"),))] == 2


async def test_once_the_bus_is_closed_rows_are_not_kept_and_the_stop_logs_them_lost() -> None:
    # A --workers worker whose supervisor died: its private nats-server and the store are gone.
    bus = InProcessBus()
    outbox = LogOutbox(bus, LogConfig(flush_ms=10))
    with log_lines("gateway.ingress.accounting", logging.WARNING) as lines:
        outbox.start()
        await bus.aclose()
        outbox.add(*_request(1))
        with anyio.fail_after(WAIT):
            await outbox.aclose(wait=60.0)  # nothing to wait for on a closed bus
    assert outbox.waiting == 2
    assert lines.messages == [
        "request log: 2 rows not acknowledged by the store at stop (2 never sent: lost)"
    ]


async def test_a_stop_with_a_batch_sent_and_unanswered_says_the_store_may_hold_it() -> None:
    bus = InProcessBus()
    outbox = LogOutbox(bus, LogConfig(flush_ms=10))
    try:
        async with bus.subscribe(subjects.LOG_APPEND) as silent:  # takes it, never answers
            with log_lines("gateway.ingress.accounting", logging.WARNING) as lines:
                outbox.start()
                outbox.add(*_request(1))
                with anyio.fail_after(WAIT):
                    await anext(aiter(silent))
                outbox.add(*_request(2))  # waits for the batch in flight
                await outbox.aclose(wait=0.0)
    finally:
        await bus.aclose()
    assert lines.messages == [
        "request log: 4 rows not acknowledged by the store at stop (2 never sent: lost; "
        "2 sent: lost unless the store committed them before it went)"
    ]


async def test_a_row_no_bus_can_carry_is_dropped_and_the_rows_around_it_are_committed(
    tmp_path: Path,
) -> None:
    # An attempt whose status was an upstream's ``"code": true``: sent again for ever, it held
    # back every row after it until the ingress stopped.
    bus = InProcessBus()
    outbox = LogOutbox(bus, LogConfig(flush_ms=10))
    path = tmp_path / "log.db"
    done, _ = _request(1)
    unreadable = Observation(
        endpoint="m:a", model="m", outcome="failure", request_id="r1", status=True
    )
    store = StoreActor(str(path), LogConfig(flush_ms=10))
    try:
        with log_lines("gateway.ingress.accounting", logging.ERROR) as lines:
            async with anyio.create_task_group() as tg:
                await tg.start(store.run, bus)
                outbox.add(*_request(0))
                outbox.add(done, (unreadable,))
                outbox.add(*_request(2))
                outbox.start()
                await _drained(outbox)
                outbox.add(*_request(3))  # and the next request goes straight through
                await _drained(outbox)
                store.request_stop()
    finally:
        await outbox.aclose()
        await bus.aclose()
    assert outbox.dropped == 1
    assert any("1 rows dropped: no bus message can carry them" in line for line in lines.messages)
    assert _kinds(path) == [
        (f"r{i}", kind)
        for i in range(4)
        for kind in ("attempt", "request")
        if (i, kind) != (1, "attempt")
    ]
