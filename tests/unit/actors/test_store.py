"""StoreActor: batches answered once committed and committed once, batching, the bounded queue
refusing (never losing) a batch, clean stop, admin verbs; the contract suite, run over both
of the request log's databases (``log_db``: SQLite and PostgreSQL)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from actors import StoreActor
from bus import InProcessBus
from schemas import (
    AdminCommand,
    AdminReply,
    ErrorReply,
    LogAppend,
    LogAppended,
    Observation,
    RequestCompleted,
    subjects,
)
from schemas.config import DatabaseConfig, LogConfig
from tests.unit.actors import WAIT
from tests.unit.actors.log_databases import LogDatabase

if TYPE_CHECKING:
    from pathlib import Path


async def admin(bus: InProcessBus, verb: str, **args: Any) -> dict[str, Any]:
    reply = await bus.request(
        subjects.admin("log", verb),
        AdminCommand(args=args, by="test"),
        reply_type=AdminReply,
        timeout=WAIT,
    )
    assert isinstance(reply, AdminReply), reply
    return reply.result


async def put(
    bus: InProcessBus, seq: int, *msgs: Observation | RequestCompleted, sender: str = "ing-1"
) -> None:
    """Publish ``msgs`` as the batch ``seq`` of ``sender``, not waiting for its answer."""
    await bus.publish(subjects.LOG_APPEND, batch(seq, *msgs, sender=sender))


def batch(seq: int, *msgs: Observation | RequestCompleted, sender: str = "ing-1") -> LogAppend:
    return LogAppend(
        sender=sender,
        seq=seq,
        requests=tuple(m for m in msgs if isinstance(m, RequestCompleted)),
        attempts=tuple(m for m in msgs if isinstance(m, Observation)),
    )


def obs(i: int, **kw: Any) -> Observation:
    fields: dict[str, Any] = {
        "endpoint": "m:a",
        "model": "m",
        "outcome": "success",
        "request_id": f"r{i}",
        "caller": "ip:10.0.0.1",
        "ts": time.time(),
    }
    return Observation(**{**fields, **kw})


async def test_store_with_fallback_request_writes_request_row_and_attempt_rows(
    bus: InProcessBus, log_db: LogDatabase
) -> None:
    store = StoreActor(log_db.config, LogConfig(flush_ms=10_000))
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        await put(
            bus,
            1,
            obs(1, outcome="failure", status=500, error_kind="http_error"),
            Observation(
                endpoint="m:b",
                model="m",
                outcome="success",
                attempt=2,
                fallback=True,
                request_id="r1",
                status=200,
                credential_id="k-abc",
                completion_tokens=5,
                ts=time.time(),
            ),
            RequestCompleted(
                request_id="r1",
                requested_model="alias",
                model="m",
                endpoint="m:b",
                attempts=2,
                fallback=True,
                status=200,
                caller="ip:10.0.0.1",
                ts=time.time(),
            ),
        )
        rows = (await admin(bus, "query", request_id="r1"))["rows"]
        store.request_stop()
    assert [(r["kind"], r["endpoint"], r["attempt"], r["fallback"]) for r in rows] == [
        ("attempt", "m:a", 1, False),
        ("attempt", "m:b", 2, True),
        ("request", "m:b", 2, True),
    ]
    assert rows[0]["status"] == 500 and rows[0]["outcome"] == "failure"
    assert rows[2]["requested_model"] == "alias" and rows[2]["outcome"] == "success"
    assert rows[2]["caller_id"].startswith("c-") and "10.0.0.1" not in rows[2]["caller_id"]


async def test_store_commits_a_full_batch_without_waiting_for_the_timer(
    bus: InProcessBus, log_db: LogDatabase
) -> None:
    store = StoreActor(log_db.config, LogConfig(batch_rows=5, flush_ms=60_000))
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        for i in range(4):
            await put(bus, i + 1, obs(i))
        # Answered once committed: the flush timer is a minute away, so only a full batch can.
        fifth = await bus.request(
            subjects.LOG_APPEND, batch(5, obs(4)), reply_type=LogAppended, timeout=WAIT
        )
        store.request_stop()
    assert fifth == LogAppended(seq=5)
    assert len(await log_db.rows()) == 5


async def test_store_with_full_queue_refuses_a_batch_never_blocking_and_takes_it_later(
    bus: InProcessBus, log_db: LogDatabase
) -> None:
    store = StoreActor(log_db.config, LogConfig(batch_rows=10, queue_rows=10, flush_ms=60_000))
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        # Publishing never yields, so all 25 reach the store before its flusher can run.
        for i in range(25):
            await put(bus, i + 1, obs(i), sender=f"ing-{i}")
        stats = await admin(bus, "flush")
        again: list[LogAppended | ErrorReply] = []

        async def resend() -> None:  # answered once committed: by the flush below
            again.append(
                await bus.request(
                    subjects.LOG_APPEND,
                    batch(25, obs(24), sender="ing-24"),
                    reply_type=LogAppended,
                    timeout=WAIT,
                )
            )

        async with (
            bus.subscribe(subjects.LOG_APPEND) as appends,  # sees it; the store answers
            anyio.create_task_group() as sending,
        ):
            sending.start_soon(resend)
            with anyio.fail_after(WAIT):
                await anext(aiter(appends))
            # In the store's mailbox now, so handled before the requests below.
            taken = await admin(bus, "stats")
            await admin(bus, "flush")
        store.request_stop()
    assert stats["written"] == 10
    assert stats["refused_queue_full"] == 15 and stats["dropped"] == 0
    assert taken["pending"] == 1
    assert again == [LogAppended(seq=25)]  # a refused batch sent again is taken


async def test_store_answers_a_batch_once_committed_and_commits_a_resent_one_once(
    bus: InProcessBus, log_db: LogDatabase
) -> None:
    done = RequestCompleted(request_id="r1", model="m", cost_usd=0.5, ts=time.time())
    sent = batch(1, obs(1), done)
    answers = []
    for _ in range(2):  # the second store is a restart: it knows the batch from the file
        store = StoreActor(log_db.config, LogConfig(flush_ms=10))
        async with anyio.create_task_group() as tg:
            await tg.start(store.run, bus)
            for _ in range(2):  # as after a lost answer: the same batch again
                answers.append(
                    await bus.request(
                        subjects.LOG_APPEND, sent, reply_type=LogAppended, timeout=WAIT
                    )
                )
            spend = await bus.request(
                subjects.admin("spend", "report"),
                AdminCommand(args={"since": 0}),
                reply_type=AdminReply,
                timeout=WAIT,
            )
            store.request_stop()
    assert answers == [
        LogAppended(seq=1),
        LogAppended(seq=1, duplicate=True),
        LogAppended(seq=1, duplicate=True),
        LogAppended(seq=1, duplicate=True),
    ]
    assert [(r["kind"], r["request_id"]) for r in await log_db.rows()] == [
        ("request", "r1"),
        ("attempt", "r1"),
    ]
    assert isinstance(spend, AdminReply)
    assert spend.result["total_usd"] == 0.5, spend.result


async def test_store_on_clean_stop_commits_every_delivered_batch(
    bus: InProcessBus, log_db: LogDatabase
) -> None:
    store = StoreActor(log_db.config, LogConfig(batch_rows=1000, queue_rows=1000))
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        for i in range(300):
            await put(bus, i + 1, obs(i))
        store.request_stop()  # the batches still sit in the subscription's queue
    assert len(await log_db.rows()) == 300


async def test_store_prune_deletes_rows_past_retention(
    bus: InProcessBus, log_db: LogDatabase
) -> None:
    store = StoreActor(log_db.config, LogConfig(retention_days=1))
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        await put(bus, 1, obs(1))
        old = Observation(
            endpoint="m:a",
            model="m",
            outcome="success",
            request_id="old",
            ts=time.time() - 2 * 86_400,
        )
        await put(bus, 2, old)
        await admin(bus, "flush")
        result = await admin(bus, "prune")
        store.request_stop()
    assert result == {"deleted": 1}
    assert [r["request_id"] for r in await log_db.rows()] == ["r1"]


async def test_store_with_unknown_verb_or_bad_args_replies_invalid_request(
    bus: InProcessBus, log_db: LogDatabase
) -> None:
    store = StoreActor(log_db.config, LogConfig())
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        unknown = await bus.request(
            subjects.admin("log", "explode"), AdminCommand(), reply_type=AdminReply, timeout=WAIT
        )
        bad = await bus.request(
            subjects.admin("log", "query"),
            AdminCommand(args={"limit": "many"}),
            reply_type=AdminReply,
            timeout=WAIT,
        )
        store.request_stop()
    assert isinstance(unknown, ErrorReply) and "known: aggregate, flush, prune, query, stats" in (
        unknown.message
    )
    assert isinstance(bad, ErrorReply) and bad.code == "invalid_request"


async def committed(bus: InProcessBus, seq: int, *msgs: Observation) -> dict[str, Any]:
    """``log/stats`` once the batch ``seq`` of ``msgs`` (and so every earlier one) is
    committed by the store's own flusher (no flush command): the store answers a batch once
    it is committed."""
    answer = await bus.request(
        subjects.LOG_APPEND, batch(seq, *msgs), reply_type=LogAppended, timeout=WAIT
    )
    assert answer == LogAppended(seq=seq)
    return await admin(bus, "stats")


@pytest.mark.parametrize("verb", ["query", "flush"])
async def test_store_keeps_committing_on_its_own_after_a_query_or_flush(
    bus: InProcessBus, log_db: LogDatabase, verb: str
) -> None:
    store = StoreActor(log_db.config, LogConfig(batch_rows=4, flush_ms=20))
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        await committed(bus, 1, obs(0))  # the flusher is now waiting for the next row
        await admin(bus, verb)
        for i in range(1, 3):  # the flusher commits them as they come
            await put(bus, i + 1, obs(i))
        timer = await committed(bus, 4, obs(3))
        await admin(bus, verb)
        for i in range(4, 11):  # two full batches
            await put(bus, i + 1, obs(i))
        batches = await committed(bus, 12, obs(11))
        store.request_stop()
    assert (timer["written"], timer["pending"]) == (4, 0)
    assert (batches["written"], batches["pending"]) == (12, 0)
    assert len(await log_db.rows()) == 12


async def test_store_with_a_failed_write_refuses_the_batch_and_commits_it_once_when_sent_again(
    bus: InProcessBus, log_db: LogDatabase
) -> None:
    sent = batch(1, obs(1), RequestCompleted(request_id="r1", model="m", ts=time.time()))
    store = StoreActor(log_db.config, LogConfig())
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        # The write fails after the rows went in: their table is away.
        await log_db.execute("ALTER TABLE spend_hourly RENAME TO spend_hourly_away")
        failed = await bus.request(subjects.LOG_APPEND, sent, reply_type=LogAppended, timeout=WAIT)
        await log_db.execute("ALTER TABLE spend_hourly_away RENAME TO spend_hourly")
        again = await bus.request(subjects.LOG_APPEND, sent, reply_type=LogAppended, timeout=WAIT)
        stats = await admin(bus, "stats")
        store.request_stop()
    assert isinstance(failed, ErrorReply) and failed.retryable
    assert again == LogAppended(seq=1)
    assert stats["refused_write_failed"] == 1
    assert [(r["kind"], r["request_id"]) for r in await log_db.rows()] == [
        ("request", "r1"),
        ("attempt", "r1"),
    ]


async def test_store_leaves_out_a_row_no_database_holds_and_commits_the_rest_of_its_batch(
    bus: InProcessBus, log_db: LogDatabase
) -> None:
    poisoned = RequestCompleted(request_id="r1", model="m", prompt_tokens=10**30, ts=time.time())
    huge = obs(2, completion_tokens=2**63)
    store = StoreActor(log_db.config, LogConfig())
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        first = await bus.request(
            subjects.LOG_APPEND, batch(1, obs(1), poisoned), reply_type=LogAppended, timeout=WAIT
        )
        second = await bus.request(
            subjects.LOG_APPEND, batch(2, huge, obs(3)), reply_type=LogAppended, timeout=WAIT
        )
        stats = await admin(bus, "stats")
        store.request_stop()
    assert (first, second) == (LogAppended(seq=1), LogAppended(seq=2))
    assert stats["refused_unwritable_rows"] == 2 and stats["refused_write_failed"] == 0
    assert [(r["kind"], r["request_id"]) for r in await log_db.rows()] == [
        ("attempt", "r1"),
        ("attempt", "r3"),
    ]


async def test_store_a_nul_in_text_is_left_out_where_the_database_refuses_it(
    bus: InProcessBus, log_db: LogDatabase
) -> None:
    # Any caller may name a model "x\x00": PostgreSQL refuses a NUL in text, and the batch
    # carrying it failed every write, the ingress sending it again forever.
    nul = RequestCompleted(request_id="r1", model="x\x00", ts=time.time())
    store = StoreActor(log_db.config, LogConfig())
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        answer = await bus.request(
            subjects.LOG_APPEND, batch(1, obs(1), nul), reply_type=LogAppended, timeout=WAIT
        )
        stats = await admin(bus, "stats")
        store.request_stop()
    refused = log_db.kind == "postgres"  # SQLite stores it as it is
    assert answer == LogAppended(seq=1)
    assert stats["refused_unwritable_rows"] == int(refused) and stats["refused_write_failed"] == 0
    kept = [(r["kind"], r["request_id"]) for r in await log_db.rows()]
    assert sorted(kept) == (
        [("attempt", "r1")] if refused else [("attempt", "r1"), ("request", "r1")]
    )


async def test_two_stores_on_one_postgres_given_the_same_batches_at_once_commit_each_once(
    postgres_url: str, tmp_path: Path
) -> None:
    # Two actor hosts (each its own bus and store) sharing the database, as during a
    # takeover: an ingress that lost an answer sends the batch to the other host.
    database = DatabaseConfig(path=str(tmp_path / "llmgw.db"), url=postgres_url)
    log_db = LogDatabase("postgres", database)
    buses = [InProcessBus(), InProcessBus()]
    stores = [StoreActor(database, LogConfig(flush_ms=10)) for _ in buses]
    answers: list[LogAppended] = []

    async def send(bus: InProcessBus, sent: LogAppend) -> None:
        reply = await bus.request(subjects.LOG_APPEND, sent, reply_type=LogAppended, timeout=WAIT)
        assert isinstance(reply, LogAppended), reply
        answers.append(reply)

    async with anyio.create_task_group() as tg:
        for store, bus in zip(stores, buses, strict=True):
            await tg.start(store.run, bus)
        await send(buses[0], batch(1, obs(0)))  # the sender is known to the database
        for seq in range(2, 12):
            sent = batch(seq, obs(seq), RequestCompleted(request_id=f"r{seq}", cost_usd=1.0))
            async with anyio.create_task_group() as both:
                for bus in buses:
                    both.start_soon(send, bus, sent)
        for store in stores:
            store.request_stop()
    for bus in buses:
        await bus.aclose()
    fresh = sorted(a.seq for a in answers if not a.duplicate)
    assert fresh == list(range(1, 12))  # each batch taken by exactly one of the two
    assert len(await log_db.rows("WHERE kind = 'attempt'")) == 11
    (spend,) = await log_db.fetch(
        "SELECT SUM(requests) AS n, SUM(cost_usd) AS usd FROM spend_hourly"
    )
    assert (spend["n"], spend["usd"]) == (10, 10.0)


async def test_store_on_postgres_that_lost_its_connections_commits_the_next_batch_once(
    bus: InProcessBus, postgres_url: str, tmp_path: Path
) -> None:
    database = DatabaseConfig(path=str(tmp_path / "llmgw.db"), url=postgres_url)
    log_db = LogDatabase("postgres", database)
    sent = batch(1, obs(1), RequestCompleted(request_id="r1", model="m", ts=time.time()))
    store = StoreActor(database, LogConfig())
    answers: list[LogAppended | ErrorReply] = []
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        # The database restarted (or a proxy dropped it): every connection of the store ends.
        await log_db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        for _ in range(2):  # as its ingress does: sent again while refused
            answers.append(
                await bus.request(subjects.LOG_APPEND, sent, reply_type=LogAppended, timeout=WAIT)
            )
            if isinstance(answers[-1], LogAppended):
                break
        store.request_stop()
    # Reconnected: refused at most once (a write on a connection not yet seen closed), then
    # committed, once.
    assert answers[-1] == LogAppended(seq=1), answers
    assert all(isinstance(a, ErrorReply) and a.retryable for a in answers[:-1])
    assert [r["request_id"] for r in await log_db.rows()] == ["r1", "r1"]
