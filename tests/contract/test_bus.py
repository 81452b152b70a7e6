"""One behaviour suite that every Bus implementation passes (in-process and NATS), kept
history (streams and replay) included.

Tests wait on results, never on time: to show a message was NOT delivered, a later message on
the same subscription arrives first (delivery keeps publish order per subscription).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import urllib.request
import uuid
from typing import TYPE_CHECKING, Any, cast

import anyio
import nats
import pytest
import uvloop

from bus import (
    Bus,
    BusClosedError,
    InProcessBus,
    KvConflictError,
    KvEntry,
    NatsBus,
    NoRespondersError,
    RequestTimeoutError,
    encode,
    open_bus,
)
from schemas import (
    ConfigChanged,
    ErrorReply,
    Observation,
    ProbeGrant,
    ProbeRequest,
    RouteNotFoundError,
    RoutePlan,
    RouteRequest,
    raise_for_reply,
    subjects,
)
from tests.fixtures.logs import log_lines
from tests.fixtures.nats import free_port, start_nats_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator
    from pathlib import Path

    from bus import Envelope, Subscription
    from schemas import Message
    from tests.fixtures.nats import NatsCluster

WAIT_S = 10.0


@pytest.fixture(params=["inprocess", pytest.param("nats", marks=pytest.mark.nats)])
async def any_bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    """A fresh bus of each implementation, opened through ``open_bus``, closed afterwards."""
    url = "inproc://" if request.param == "inprocess" else request.getfixturevalue("nats_url")
    bus = await open_bus(url)
    assert isinstance(bus, InProcessBus if request.param == "inprocess" else NatsBus)
    try:
        yield bus
    finally:
        await bus.aclose()


@pytest.fixture
def prefix() -> str:
    """A subject root of this test alone, so tests on a shared NATS server cannot cross-talk."""
    return f"t{uuid.uuid4().hex}"


def probe(rid: str) -> ProbeRequest:
    return ProbeRequest(request_id=rid)


def rid_of(env: Envelope) -> str:
    assert isinstance(env.message, ProbeRequest)
    return env.message.request_id


async def take(sub: Subscription, n: int) -> list[Envelope]:
    """The next ``n`` envelopes of ``sub``."""
    out: list[Envelope] = []
    async with asyncio.timeout(WAIT_S):
        async for env in sub:
            out.append(env)
            if len(out) == n:
                break
    return out


async def answer(sub: Subscription, reply_for: Callable[[Envelope], Message]) -> None:
    """Respond to every request on ``sub`` until it ends."""
    async for env in sub:
        await env.respond(reply_for(env))


async def test_publish_to_subject_with_two_subscribers_delivers_to_both(
    any_bus: Bus, prefix: str
) -> None:
    subject = f"{prefix}.a"
    async with any_bus.subscribe(subject) as one, any_bus.subscribe(subject) as two:
        await any_bus.publish(subject, probe("1"))
        for sub in (one, two):
            (env,) = await take(sub, 1)
            assert (env.subject, env.message, env.reply) == (subject, probe("1"), None)


async def test_publish_to_subject_without_subscribers_is_silently_dropped(
    any_bus: Bus, prefix: str
) -> None:
    await any_bus.publish(f"{prefix}.nobody", probe("1"))


async def test_publish_keeps_order_per_subscription(any_bus: Bus, prefix: str) -> None:
    subject = f"{prefix}.seq"
    async with any_bus.subscribe(subject) as sub:
        for i in range(50):
            await any_bus.publish(subject, probe(str(i)))
        assert [rid_of(env) for env in await take(sub, 50)] == [str(i) for i in range(50)]


async def test_star_wildcard_matches_exactly_one_token(any_bus: Bus, prefix: str) -> None:
    async with any_bus.subscribe(f"{prefix}.*.x") as sub:
        for subject in (f"{prefix}.x", f"{prefix}.a.b.x", f"{prefix}.a.y", f"{prefix}.a.x"):
            await any_bus.publish(subject, probe(subject))
        await any_bus.publish(f"{prefix}.b.x", probe("sentinel"))
        got = [env.subject for env in await take(sub, 2)]
    assert got == [f"{prefix}.a.x", f"{prefix}.b.x"]


async def test_gt_wildcard_matches_one_or_more_trailing_tokens_but_not_zero(
    any_bus: Bus, prefix: str
) -> None:
    async with any_bus.subscribe(f"{prefix}.a.>") as sub:
        for subject in (f"{prefix}.a", f"{prefix}.b.c", f"{prefix}.a.b", f"{prefix}.a.b.c.d"):
            await any_bus.publish(subject, probe(subject))
        got = [env.subject for env in await take(sub, 2)]
    assert got == [f"{prefix}.a.b", f"{prefix}.a.b.c.d"]


async def test_queue_group_delivers_each_message_to_one_member_and_plain_subscribers_get_all(
    any_bus: Bus, prefix: str
) -> None:
    subject = f"{prefix}.work"
    sent = [str(i) for i in range(40)]
    got: dict[str, list[str]] = {"a": [], "b": []}
    loop = asyncio.get_running_loop()
    sentinel_to: dict[str, asyncio.Future[str]] = {
        "s1": loop.create_future(),
        "s2": loop.create_future(),
    }

    async def member(name: str, sub: Subscription) -> None:
        async for env in sub:
            rid = rid_of(env)
            got[name].append(rid)
            if rid in sentinel_to and not sentinel_to[rid].done():
                sentinel_to[rid].set_result(name)

    members = {name: any_bus.subscribe(subject, queue="q") for name in got}
    async with any_bus.subscribe(subject) as plain, asyncio.TaskGroup() as tg:
        for name, cm in members.items():
            tg.create_task(member(name, await cm.__aenter__()))
        try:
            for rid in sent:
                await any_bus.publish(subject, probe(rid))
            await any_bus.publish(subject, probe("s1"))
            async with asyncio.timeout(WAIT_S):
                first = await sentinel_to["s1"]
            # `first` has seen all it was sent before s1; once it leaves, s2 can only go to
            # the other member, which then has seen all it was sent too.
            await members.pop(first).__aexit__(None, None, None)
            await any_bus.publish(subject, probe("s2"))
            async with asyncio.timeout(WAIT_S):
                second = await sentinel_to["s2"]
        finally:
            for cm in members.values():
                await cm.__aexit__(None, None, None)
        everything = [rid_of(env) for env in await take(plain, len(sent) + 2)]

    assert second != first
    assert everything == [*sent, "s1", "s2"]
    assert sorted(got["a"] + got["b"]) == sorted([*sent, "s1", "s2"])


async def test_request_to_subject_with_responder_returns_its_reply(
    any_bus: Bus, prefix: str
) -> None:
    subject = f"{prefix}.ask"
    async with asyncio.TaskGroup() as tg, any_bus.subscribe(subject) as sub:
        tg.create_task(answer(sub, lambda env: ProbeGrant(granted=rid_of(env) == "yes")))
        reply = await any_bus.request(subject, probe("yes"), reply_type=ProbeGrant, timeout=WAIT_S)
        assert reply == ProbeGrant(granted=True)
        reply = await any_bus.request(subject, probe("no"), reply_type=ProbeGrant, timeout=WAIT_S)
        assert reply == ProbeGrant(granted=False)


async def test_request_to_queue_group_is_answered_once(any_bus: Bus, prefix: str) -> None:
    subject = f"{prefix}.ask"
    async with (
        asyncio.TaskGroup() as tg,
        any_bus.subscribe(subject, queue="q") as one,
        any_bus.subscribe(subject, queue="q") as two,
    ):
        for sub in (one, two):
            tg.create_task(answer(sub, lambda env: ProbeGrant(granted=True)))
        for _ in range(5):
            reply = await any_bus.request(subject, probe("x"), reply_type=ProbeGrant, timeout=5)
            assert reply == ProbeGrant(granted=True)


async def test_request_answered_with_error_reply_returns_error_reply(
    any_bus: Bus, prefix: str
) -> None:
    subject = subjects.model_route(f"{prefix}/gone")
    async with asyncio.TaskGroup() as tg, any_bus.subscribe(subject) as sub:
        tg.create_task(answer(sub, lambda env: RouteNotFoundError("no model gone").to_reply()))
        reply = await any_bus.request(
            subject, RouteRequest(model="gone"), reply_type=RoutePlan, timeout=WAIT_S
        )
    assert reply == ErrorReply(code="route_not_found", message="no model gone")
    with pytest.raises(RouteNotFoundError, match="no model gone"):
        raise_for_reply(reply)


async def test_request_to_silent_subscriber_raises_request_timeout(
    any_bus: Bus, prefix: str
) -> None:
    subject = f"{prefix}.silent"
    async with any_bus.subscribe(subject):
        with pytest.raises(RequestTimeoutError):
            await any_bus.request(subject, probe("1"), reply_type=ProbeGrant, timeout=0.05)


async def test_request_to_subject_without_subscribers_raises_no_responders_at_once(
    any_bus: Bus, prefix: str
) -> None:
    async with asyncio.timeout(WAIT_S / 2):  # far below the request's own timeout
        with pytest.raises(NoRespondersError):
            await any_bus.request(f"{prefix}.nobody", probe("1"), reply_type=ProbeGrant, timeout=60)


async def test_request_after_subscription_ended_raises_no_responders(
    any_bus: Bus, prefix: str
) -> None:
    subject = f"{prefix}.gone"
    async with any_bus.subscribe(subject):
        pass
    with pytest.raises(NoRespondersError):
        await any_bus.request(subject, probe("1"), reply_type=ProbeGrant, timeout=WAIT_S)


async def test_close_while_subscribed_ends_iterator_and_later_calls_raise_bus_closed(
    any_bus: Bus, prefix: str
) -> None:
    subject = f"{prefix}.closing"
    first = asyncio.Event()

    async def consume(sub: Subscription) -> int:
        count = 0
        async for _ in sub:
            count += 1
            first.set()
        return count

    assert any_bus.connected
    async with any_bus.subscribe(subject) as sub:
        consumer = asyncio.create_task(consume(sub))
        await any_bus.publish(subject, probe("1"))
        async with asyncio.timeout(WAIT_S):
            await first.wait()
            await any_bus.aclose()
            assert await consumer == 1

    assert not any_bus.connected

    with pytest.raises(BusClosedError):
        await any_bus.publish(subject, probe("2"))
    with pytest.raises(BusClosedError):
        await any_bus.request(subject, probe("3"), reply_type=ProbeGrant, timeout=1)
    with pytest.raises(BusClosedError):
        async with any_bus.subscribe(subject):
            pass
    await any_bus.aclose()  # idempotent


async def test_disconnected_does_not_return_while_the_bus_is_connected(
    any_bus: Bus, prefix: str
) -> None:
    subject = f"{prefix}.ask"
    lost = asyncio.create_task(any_bus.disconnected())
    try:
        async with asyncio.TaskGroup() as tg, any_bus.subscribe(subject) as sub:
            tg.create_task(answer(sub, lambda env: ProbeGrant(granted=True)))
            # A round trip after the wait began: had it returned, it would be done by now.
            reply = await any_bus.request(
                subject, probe("1"), reply_type=ProbeGrant, timeout=WAIT_S
            )
        assert reply == ProbeGrant(granted=True)
        assert any_bus.connected and not lost.done()
    finally:
        lost.cancel()


@pytest.mark.parametrize("raw", ["org/qwen2.5:7b", "a.b.c", "*", ">", "sp ace", "ünï", ""])
async def test_ids_escaped_by_token_round_trip_through_a_wildcard_subscription(
    any_bus: Bus, raw: str
) -> None:
    endpoint = f"{raw}{uuid.uuid4().hex}"
    obs = Observation(endpoint=endpoint, model=raw, outcome="success")
    async with any_bus.subscribe(subjects.OBSERVATION_ANY) as sub:
        await any_bus.publish(subjects.observation(endpoint), obs)
        async with asyncio.timeout(WAIT_S):
            async for env in sub:  # a shared NATS server may carry others' observations
                if isinstance(env.message, Observation) and env.message.endpoint == endpoint:
                    break
    assert env.subject == subjects.observation(endpoint)
    assert subjects.untoken(env.subject.split(".")[-1]) == endpoint
    assert env.message == obs


@pytest.mark.parametrize("subject", ["", "a..b", "a.b.", "a.>.b", "a.b*", "a b"])
async def test_subscribe_to_malformed_subject_raises_value_error(
    any_bus: Bus, subject: str
) -> None:
    with pytest.raises(ValueError, match="invalid subject"):
        async with any_bus.subscribe(subject):
            pass


@pytest.mark.parametrize("subject", ["", "a..b", "a.*", "a.>", "a b"])
async def test_publish_or_request_to_malformed_subject_raises_value_error(
    any_bus: Bus, subject: str
) -> None:
    with pytest.raises(ValueError, match="invalid subject"):
        await any_bus.publish(subject, probe("1"))
    with pytest.raises(ValueError, match="invalid subject"):
        await any_bus.request(subject, probe("1"), reply_type=ProbeGrant, timeout=1)


@pytest.mark.nats
async def test_nats_subscription_entered_on_one_connection_answers_request_from_another(
    nats_url: str, prefix: str
) -> None:
    server_side = await NatsBus.connect(nats_url, name="responder")
    client_side = await NatsBus.connect(nats_url, name="requester")
    try:
        subject = f"{prefix}.remote"
        async with asyncio.TaskGroup() as tg, server_side.subscribe(subject) as sub:
            tg.create_task(answer(sub, lambda env: ProbeGrant(granted=True)))
            reply = await client_side.request(
                subject, probe("1"), reply_type=ProbeGrant, timeout=WAIT_S
            )
        assert reply == ProbeGrant(granted=True)
    finally:
        await client_side.aclose()
        await server_side.aclose()


@pytest.mark.nats
async def test_nats_reply_goes_only_to_an_inbox_never_to_a_subject_others_read(
    nats_url: str, prefix: str
) -> None:
    responder = await NatsBus.connect(nats_url, name="responder")
    raw = await nats.connect(nats_url)
    try:
        broadcast = await raw.subscribe(f"{prefix}.broadcast")
        async with asyncio.TaskGroup() as tg, responder.subscribe(f"{prefix}.svc") as sub:
            # A requester naming a subject others subscribe to as its reply-to ...
            await raw.publish(f"{prefix}.svc", encode(probe("1")), reply=f"{prefix}.broadcast")
            redirected = await anext(sub)
            await redirected.respond(ProbeGrant(granted=True))
            # ... is not answered there; a later request from the same connection is, so
            # the dropped answer would have reached that connection first.
            asked = tg.create_task(raw.request(f"{prefix}.svc", encode(probe("2")), timeout=WAIT_S))
            honest = await anext(sub)
            await honest.respond(ProbeGrant(granted=True))
            answered = await asked
        assert answered.subject.startswith("_INBOX.")
        assert broadcast.pending_msgs == 0
    finally:
        await raw.close()
        await responder.aclose()


@contextlib.contextmanager
def _monitored_nats(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A nats-server of its own with its monitoring endpoint on: (its URL, the monitor's)."""
    port = free_port()
    conf = tmp_path / "nats.conf"
    conf.write_text(f'http: "127.0.0.1:{port}"\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n')
    with start_nats_server(config_file=conf) as url:
        yield url, f"http://127.0.0.1:{port}"


def _connection(monitor: str, name: str) -> dict[str, Any]:
    """The monitoring endpoint's view of the client connection named ``name``."""
    with urllib.request.urlopen(f"{monitor}/connz?subs=1", timeout=WAIT_S) as answer:
        connz = json.loads(answer.read())
    (conn,) = (c for c in connz["connections"] if c.get("name") == name)
    return cast("dict[str, Any]", conn)


@pytest.mark.nats
async def test_nats_subscribers_of_one_subject_on_one_bus_share_one_server_subscription(
    tmp_path: Path, prefix: str
) -> None:
    # Each server subscription costs a copy of every message, parsed and decoded apart (an
    # observation reached three actors of a host): the server sends one, the bus gives it to
    # every local subscriber, and the subscription lasts while any of them listens.
    subject = f"{prefix}.shared"
    with _monitored_nats(tmp_path) as (url, monitor):
        bus = await NatsBus.connect(url, name="sharer")
        try:
            first, second = bus.subscribe(subject), bus.subscribe(subject)
            # Entered at once: the second waits for the first's server subscription.
            one, two = await asyncio.gather(first.__aenter__(), second.__aenter__())
            sent = _connection(monitor, "sharer")["out_msgs"]
            await bus.publish(subject, probe("1"))
            assert [rid_of(env) for sub in (one, two) for env in await take(sub, 1)] == ["1"] * 2
            conn = _connection(monitor, "sharer")
            assert conn["out_msgs"] - sent == 1
            assert conn["subscriptions_list"].count(subject) == 1
            await first.__aexit__(None, None, None)
            await bus.publish(subject, probe("2"))
            assert [rid_of(env) for env in await take(two, 1)] == ["2"]
            await second.__aexit__(None, None, None)
            with pytest.raises(NoRespondersError):  # a round trip: the server read the UNSUB
                await bus.request(
                    f"{prefix}.nobody", probe("x"), reply_type=ProbeGrant, timeout=WAIT_S
                )
            assert subject not in _connection(monitor, "sharer").get("subscriptions_list", [])
        finally:
            await bus.aclose()


@pytest.mark.nats
async def test_nats_family_serves_its_wildcard_and_its_subjects_with_one_server_subscription(
    tmp_path: Path, prefix: str
) -> None:
    # An actors host's steering actor (llmgw.obs.*) and an endpoint's actors (llmgw.obs.<id>)
    # each got a copy of every observation: with the family, the server sends one, given to
    # the subscribers of its subject and of the wildcard, in order, each once.
    family = f"{prefix}.obs.*"
    one, other = f"{prefix}.obs.a", f"{prefix}.obs.b"
    with _monitored_nats(tmp_path) as (url, monitor):
        bus = await NatsBus.connect(url, name="family", families=(family,))
        try:
            a_cm, wild_cm, b_cm = bus.subscribe(one), bus.subscribe(family), bus.subscribe(other)
            a, wild, b = await asyncio.gather(
                a_cm.__aenter__(), wild_cm.__aenter__(), b_cm.__aenter__()
            )
            assert _connection(monitor, "family")["subscriptions_list"].count(family) == 1
            sent = _connection(monitor, "family")["out_msgs"]
            await bus.publish(one, probe("1"))
            await bus.publish(other, probe("2"))
            await bus.publish(one, probe("3"))
            assert [rid_of(env) for env in await take(a, 2)] == ["1", "3"]
            assert [rid_of(env) for env in await take(b, 1)] == ["2"]
            assert [(env.subject, rid_of(env)) for env in await take(wild, 3)] == [
                (one, "1"),
                (other, "2"),
                (one, "3"),
            ]
            conn = _connection(monitor, "family")
            assert conn["out_msgs"] - sent == 3
            assert not {one, other} & set(conn["subscriptions_list"])
            # The wildcard's subscriber leaves: its subjects' subscribers still get theirs.
            await wild_cm.__aexit__(None, None, None)
            await bus.publish(other, probe("4"))
            assert [rid_of(env) for env in await take(b, 1)] == ["4"]
            await a_cm.__aexit__(None, None, None)
            await b_cm.__aexit__(None, None, None)
            with pytest.raises(NoRespondersError):  # a round trip: the server read the UNSUB
                await bus.request(
                    f"{prefix}.nobody", probe("x"), reply_type=ProbeGrant, timeout=WAIT_S
                )
            assert family not in _connection(monitor, "family").get("subscriptions_list", [])
            # Opened again by the next subscriber of the family.
            async with bus.subscribe(one) as again:
                await bus.publish(one, probe("5"))
                assert [rid_of(env) for env in await take(again, 1)] == ["5"]
        finally:
            await bus.aclose()


@pytest.mark.nats
async def test_nats_connect_to_unreachable_server_raises_bus_closed() -> None:
    with pytest.raises(BusClosedError, match="cannot connect"):
        await NatsBus.connect("nats://127.0.0.1:1", connect_timeout=0.5)


@pytest.mark.nats
def test_nats_close_while_reconnecting_to_a_dead_server_closes_and_raises_nothing(
    prefix: str,
) -> None:
    """On uvloop (what ``llmgw serve`` runs), nats-py's close flushes what it buffered while
    reconnecting into the transport it lost, and uvloop raises RuntimeError: a ``--workers``
    worker whose supervisor (and so its nats-server) died ended on that traceback."""
    uvloop.run(_close_after_the_server_died(prefix))


async def _close_after_the_server_died(prefix: str) -> None:
    with log_lines("bus.nats_bus", logging.WARNING) as lines:
        with start_nats_server() as url:
            bus = await NatsBus.connect(url)
        await lines.wait_for("disconnected; reconnecting", 1, WAIT_S)
        # Buffered for a reconnect that never comes.
        await bus.publish(f"{prefix}.x", Observation(endpoint="e", model="m", outcome="success"))
        with anyio.fail_after(WAIT_S):  # no waiting on the reconnects
            await bus.aclose()
        assert bus.closed
        assert await lines.wait_for("closing the NATS connection: RuntimeError", 1, 0)


@pytest.mark.nats
async def test_nats_disconnected_returns_when_the_connection_is_lost_and_waits_once_back(
    tmp_path: Path, prefix: str
) -> None:
    subject = f"{prefix}.ask"
    with start_nats_server(tmp_path / "nats") as url:
        bus = await NatsBus.connect(url)
        port = int(url.rsplit(":", 1)[1])
        lost = asyncio.create_task(bus.disconnected())
        # What it is for: a request whose reply cannot come (its responder is silent here;
        # on a lost connection, a reply sent meanwhile is lost) waits while the loss is told.
        async with bus.subscribe(subject) as silent:
            pending = asyncio.create_task(
                bus.request(subject, probe("1"), reply_type=ProbeGrant, timeout=60)
            )
            await take(silent, 1)
    try:
        with anyio.fail_after(WAIT_S):
            await lost
        assert not bus.connected and not pending.done()
        with anyio.fail_after(WAIT_S):
            await bus.disconnected()  # at once while it is lost
        with start_nats_server(tmp_path / "nats", port=port):
            with anyio.fail_after(WAIT_S):
                while not bus.connected:
                    await bus.reconnected()
            again = asyncio.create_task(bus.disconnected())
            # Back: a round trip on the restored connection, and the wait still waits.
            with pytest.raises(NoRespondersError):
                await bus.request(
                    f"{prefix}.nobody", probe("2"), reply_type=ProbeGrant, timeout=WAIT_S
                )
            assert not again.done()
            await bus.aclose()
            with anyio.fail_after(WAIT_S):
                await again  # closing is a loss too
    finally:
        pending.cancel()
        await bus.aclose()


# -- kept history: ensure_stream / replay (JetStream on NATS, bounded memory in process) ----


@pytest.fixture
async def stream(any_bus: Bus) -> AsyncIterator[str]:
    """A stream name of this test alone, deleted afterwards."""
    name = f"TEST_{uuid.uuid4().hex}"
    yield name
    await any_bus.delete_stream(name)


def _history_subject(prefix: str, leaf: str) -> str:
    # Outside llmgw.events.>: a gateway started earlier on the same NATS server keeps its
    # events stream there, and JetStream refuses overlapping streams.
    return f"llmgw-test.{prefix}.{leaf}"


async def _versions(sub: Subscription, n: int) -> list[str]:
    """The versions of the next ``n`` ConfigChanged messages on ``sub``."""
    got: list[str] = []
    async with asyncio.timeout(WAIT_S):
        async for env in sub:
            assert isinstance(env.message, ConfigChanged)
            got.append(env.message.version)
            if len(got) == n:
                break
    return got


async def _stored(bus: Bus, subject: str, stream: str, last: str) -> None:
    """Returns once ``stream`` holds the message of version ``last`` (published last): NATS's
    JetStream stores a plain publish after the publisher sent it, so a replay started at once
    could meet messages its limits are about to drop. Replays until that message arrives."""
    async with bus.replay(subject, stream=stream, since=0) as sub:
        async with asyncio.timeout(WAIT_S):
            async for env in sub:
                if isinstance(env.message, ConfigChanged) and env.message.version == last:
                    return


async def test_replay_delivers_what_the_stream_kept_then_live_messages_in_order(
    any_bus: Bus,
    prefix: str,
    stream: str,
) -> None:
    subject = _history_subject(prefix, "a")
    await any_bus.ensure_stream(stream, [_history_subject(prefix, "*")], max_age=60, max_msgs=10)
    await any_bus.ensure_stream(
        stream, [_history_subject(prefix, "*")], max_age=120, max_msgs=10
    )  # an update keeps the stream
    since = time.time() - 60
    for v in ("v1", "v2"):
        await any_bus.publish(subject, ConfigChanged(version=v))
    await any_bus.publish(_history_subject(prefix, "b"), ConfigChanged(version="other"))

    async with any_bus.replay(subject, stream=stream, since=since) as sub:
        kept = await _versions(sub, 2)
        await any_bus.publish(subject, ConfigChanged(version="live"))
        assert [*kept, *await _versions(sub, 1)] == ["v1", "v2", "live"]


async def test_replay_keeps_at_most_max_msgs_and_nothing_before_since(
    any_bus: Bus,
    prefix: str,
    stream: str,
) -> None:
    subject = _history_subject(prefix, "a")
    await any_bus.ensure_stream(stream, [subject], max_age=60, max_msgs=2)
    for v in ("v1", "v2", "v3"):
        await any_bus.publish(subject, ConfigChanged(version=v))
    await _stored(any_bus, subject, stream, "v3")
    async with any_bus.replay(subject, stream=stream, since=0) as sub:
        assert await _versions(sub, 2) == ["v2", "v3"]
    async with any_bus.replay(subject, stream=stream, since=time.time() + 3600) as sub:
        await any_bus.publish(subject, ConfigChanged(version="live"))
        assert await _versions(sub, 1) == ["live"]  # nothing kept is that recent


async def test_a_busy_subject_keeps_at_most_its_own_bound_and_leaves_the_others_kept(
    any_bus: Bus,
    prefix: str,
    stream: str,
) -> None:
    # The events stream's case: one event per request on one subject must not push out the
    # rarer events of the others (the stream's whole bound would let it).
    busy, rare = _history_subject(prefix, "busy"), _history_subject(prefix, "rare")
    await any_bus.ensure_stream(
        stream, [_history_subject(prefix, "*")], max_age=60, max_msgs=10, max_msgs_per_subject=3
    )
    await any_bus.publish(rare, ConfigChanged(version="rare"))
    for i in range(8):
        await any_bus.publish(busy, ConfigChanged(version=f"b{i}"))
    await _stored(any_bus, busy, stream, "b7")

    async with any_bus.replay(_history_subject(prefix, "*"), stream=stream, since=0) as sub:
        assert await _versions(sub, 4) == ["rare", "b5", "b6", "b7"]


async def test_replay_of_a_missing_stream_raises_bus_closed_error(any_bus: Bus) -> None:
    with pytest.raises(BusClosedError):
        async with any_bus.replay(subjects.event("x"), stream="NO_SUCH_STREAM", since=0):
            pass


@pytest.fixture
def bucket() -> str:
    """A key-value bucket of this test alone."""
    return f"T{uuid.uuid4().hex[:16]}"


async def test_kv_create_of_a_present_key_conflicts_and_get_returns_value_and_revision(
    any_bus: Bus, bucket: str
) -> None:
    kv = await any_bus.key_value(bucket)
    assert await kv.get("a") is None
    rev = await kv.create("a", b"one")
    with pytest.raises(KvConflictError):
        await kv.create("a", b"two")
    assert await kv.get("a") == KvEntry("a", b"one", rev)


async def test_kv_update_lands_only_at_the_expected_revision(any_bus: Bus, bucket: str) -> None:
    kv = await any_bus.key_value(bucket)
    first = await kv.create("a", b"one")
    second = await kv.update("a", b"two", revision=first)
    assert second > first
    with pytest.raises(KvConflictError):
        await kv.update("a", b"stale", revision=first)  # a fenced writer that lost its lease
    with pytest.raises(KvConflictError):
        await kv.update("absent", b"x", revision=first)
    assert await kv.get("a") == KvEntry("a", b"two", second)
    third = await kv.put("a", b"three")
    assert third > second
    assert (await kv.get("a")) == KvEntry("a", b"three", third)


async def test_kv_delete_at_a_stale_revision_conflicts_and_a_deleted_key_can_be_created(
    any_bus: Bus, bucket: str
) -> None:
    kv = await any_bus.key_value(bucket)
    first = await kv.create("a", b"one")
    second = await kv.update("a", b"two", revision=first)
    with pytest.raises(KvConflictError):
        await kv.delete("a", revision=first)
    assert await kv.get("a") == KvEntry("a", b"two", second)
    await kv.delete("a", revision=second)
    assert await kv.get("a") is None
    await kv.delete("a")  # absent without a revision: fine
    again = await kv.create("a", b"back")
    assert await kv.get("a") == KvEntry("a", b"back", again)


async def test_kv_keys_lists_present_keys_whatever_their_characters(
    any_bus: Bus, bucket: str
) -> None:
    kv = await any_bus.key_value(bucket)
    assert await kv.keys() == []
    names = ["model:org/gpt-4.1", "endpoint:a b", "plain_key-1"]
    for name in names:
        await kv.put(name, name.encode())
    await kv.put("gone", b"x")
    await kv.delete("gone")
    assert sorted(await kv.keys()) == sorted(names)
    entry = await kv.get(names[0])
    assert entry is not None
    assert (entry.key, entry.value) == (names[0], names[0].encode())


async def test_kv_keys_lists_every_present_key_while_others_are_being_written(
    any_bus: Bus, bucket: str
) -> None:
    # Cluster members are the keys of a bucket every host writes each beat: a listing
    # missing a live host's key hands its units away. nats-py's own keys() may end its
    # listing early under concurrent writes (nats.py #842, #995).
    kv = await any_bus.key_value(bucket)
    names = [f"host-{i}" for i in range(20)]
    for name in names:
        await kv.put(name, b"beat")
    stop = asyncio.Event()

    async def beating(name: str) -> None:
        while not stop.is_set():
            await kv.put(name, b"beat")

    writers = [asyncio.create_task(beating(n)) for n in names[:5]]
    try:
        listings = [sorted(await kv.keys()) for _ in range(30)]
    finally:
        stop.set()
        await asyncio.gather(*writers)
    assert all(listing == sorted(names) for listing in listings), [
        sorted(set(names) - set(listing)) for listing in listings
    ]


async def test_kv_key_not_rewritten_within_ttl_expires_and_a_rewritten_one_lives(
    any_bus: Bus, bucket: str
) -> None:
    kv = await any_bus.key_value(bucket, ttl=1.0)
    await kv.put("lapsing", b"x")
    async with asyncio.timeout(WAIT_S):
        # The bucket expires on its own clock (JetStream's on NATS) and a lapse reaches no
        # watcher: poll the outcome, rewriting "fresh" well within its TTL each round.
        while await kv.get("lapsing") is not None:
            await kv.put("fresh", b"beat")
            await asyncio.sleep(0.1)
    assert await kv.keys() == ["fresh"]


async def test_kv_watch_gives_present_entries_then_writes_and_deletions_in_order(
    any_bus: Bus, bucket: str
) -> None:
    kv = await any_bus.key_value(bucket)
    first = await kv.put("a", b"1")
    gone = await kv.put("c", b"x")
    async with kv.watch() as changes, asyncio.timeout(WAIT_S):
        present = [await anext(changes) for _ in range(2)]
        # Each write below replaces an entry the watcher has had already: none is one a
        # later write replaces before it is delivered (NATS keeps one message a key, so
        # such a write may go unreported; see KeyValue.watch).
        b = await kv.create("model:b", b"2")
        a = await kv.update("a", b"3", revision=first)
        await kv.delete("c", revision=gone)
        got = [await anext(changes) for _ in range(3)]
    assert present == [KvEntry("a", b"1", first), KvEntry("c", b"x", gone)]
    assert got[:2] == [KvEntry("model:b", b"2", b), KvEntry("a", b"3", a)]
    assert (got[2].key, got[2].deleted, got[2].revision > a) == ("c", True, True)


async def test_kv_watch_reports_a_keys_newest_entry_when_writes_to_it_come_fast(
    any_bus: Bus, bucket: str
) -> None:
    kv = await any_bus.key_value(bucket)
    async with kv.watch() as changes, asyncio.timeout(WAIT_S):
        revisions = [await kv.put("k", str(i).encode()) for i in range(20)]
        seen = [await anext(changes)]
        while seen[-1].revision != revisions[-1]:
            seen.append(await anext(changes))
    # Some of the 20 may be coalesced (on NATS); those reported come in order, the last is
    # the newest.
    assert [e.revision for e in seen] == sorted(e.revision for e in seen)
    assert seen[-1] == KvEntry("k", b"19", revisions[-1])


async def test_kv_on_a_closed_bus_raises_bus_closed_error(any_bus: Bus, bucket: str) -> None:
    kv = await any_bus.key_value(bucket)
    await any_bus.aclose()
    with pytest.raises(BusClosedError):
        await kv.put("a", b"x")
    with pytest.raises(BusClosedError):
        await any_bus.key_value(bucket)


@pytest.mark.nats
async def test_a_bus_knows_how_many_servers_its_cluster_has(
    nats_url: str, nats_cluster: NatsCluster
) -> None:
    # Given one URL of three, the cluster announces the others.
    await _until_announced(nats_cluster.urls[0], 3)
    single, cluster = await open_bus(nats_url), await open_bus(nats_cluster.urls[0])
    try:
        assert (single.servers, cluster.servers, InProcessBus().servers) == (1, 3, 1)
    finally:
        await single.aclose()
        await cluster.aclose()


async def _until_announced(url: str, servers: int) -> None:
    """Return once the server at ``url`` announces ``servers`` in its cluster: a node an
    earlier test stopped (SIGSTOP) is announced only once its routes have re-formed."""
    announced = asyncio.Event()
    raw: Any = None

    async def discovered() -> None:
        if raw is not None and len(raw.servers) >= servers:
            announced.set()

    raw = await nats.connect(url, discovered_server_cb=discovered)
    try:
        if len(raw.servers) < servers:
            await asyncio.wait_for(announced.wait(), 10)
    finally:
        await raw.close()


async def test_a_replica_count_taken_as_a_floor_never_lowers_a_bucket_or_a_stream(
    nats_cluster: NatsCluster, bucket: str
) -> None:
    cluster = await open_bus(",".join(nats_cluster.urls))
    raw = await nats.connect(nats_cluster.urls[0])
    stream = f"{bucket}S"
    try:
        await cluster.key_value(bucket, replicas=3)
        await cluster.ensure_stream(stream, [f"{stream}.>"], max_age=60, max_msgs=9, replicas=3)
        # A host that saw one server of three while the cluster formed: R3 stays.
        await cluster.key_value(bucket, replicas=1, grow_only=True)
        await cluster.ensure_stream(
            stream, [f"{stream}.>"], max_age=60, max_msgs=9, replicas=1, grow_only=True
        )
        js = raw.jetstream()
        kept = [(await js.stream_info(n)).config.num_replicas for n in (f"KV_{bucket}", stream)]
        # A count the operator set is taken as set, lower or not.
        await cluster.key_value(bucket, replicas=1)
        lowered = (await js.stream_info(f"KV_{bucket}")).config.num_replicas
    finally:
        await raw.close()
        await cluster.aclose()

    assert (kept, lowered) == ([3, 3], 1)


async def test_nats_streams_and_buckets_take_their_replicas_from_the_cluster(
    nats_url: str, nats_cluster: NatsCluster, bucket: str
) -> None:
    single, cluster = await open_bus(nats_url), await open_bus(",".join(nats_cluster.urls))
    try:
        # One server cannot keep three copies: the replicas reach JetStream, not a default.
        with pytest.raises(BusClosedError):
            await single.key_value(bucket, replicas=3)
        with pytest.raises(BusClosedError):
            await single.ensure_stream(bucket, [f"{bucket}.>"], max_age=60, max_msgs=10, replicas=3)
        kv = await cluster.key_value(bucket, replicas=3)
        await kv.put("a", b"1")
        await cluster.ensure_stream(bucket, [f"{bucket}.>"], max_age=60, max_msgs=10, replicas=3)
        assert await kv.get("a") == KvEntry("a", b"1", 1)
    finally:
        await single.aclose()
        await cluster.aclose()
