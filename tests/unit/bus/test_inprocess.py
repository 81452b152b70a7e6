"""InProcessBus specifics the contract suite cannot see, and the subject rules both buses share."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

import pytest

from bus import (
    BusClosedError,
    CodecError,
    InProcessBus,
    NoRespondersError,
    RequestTimeoutError,
    codec,
    open_bus,
)
from bus.inprocess import STREAM_MAX_MSGS
from bus.subscribing import check_pattern, check_queue, check_subject, subject_matches
from schemas import ConfigChanged, ProbeGrant, ProbeRequest, RouteCandidate, StateRequest

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from types import FrameType

    from bus import Envelope


@pytest.fixture
async def bus() -> AsyncIterator[InProcessBus]:
    bus = InProcessBus(pending_limit=4)
    try:
        yield bus
    finally:
        await bus.aclose()


def probe(rid: str) -> ProbeRequest:
    return ProbeRequest(request_id=rid)


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.c", False),
        ("a.b", "a.b.c", False),
        ("a.b.c", "a.b", False),
        ("a.*", "a.b", True),
        ("a.*", "a", False),
        ("a.*", "a.b.c", False),
        ("*.b", "a.b", True),
        ("*.*", "a.b", True),
        ("a.>", "a.b", True),
        ("a.>", "a.b.c.d", True),
        ("a.>", "a", False),
        (">", "a", True),
        (">", "a.b", True),
        ("a.*.>", "a.b", False),
        ("a.*.>", "a.b.c", True),
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a.b.d", False),
    ],
)
def test_subject_matches_follows_nats_wildcard_rules(
    pattern: str, subject: str, expected: bool
) -> None:
    assert subject_matches(pattern, subject) is expected


@pytest.mark.parametrize("subject", ["", "a..b", ".a", "a.", "a.*", "a.>", "a*", "a b", "a\r\n"])
def test_check_subject_with_empty_token_wildcard_or_space_raises_value_error(
    subject: str,
) -> None:
    with pytest.raises(ValueError, match="invalid subject"):
        check_subject(subject)


@pytest.mark.parametrize("pattern", ["", "a..b", "a.>.b", "a.b*", "a.>b", "a b"])
def test_check_pattern_with_misplaced_wildcard_raises_value_error(pattern: str) -> None:
    with pytest.raises(ValueError, match="invalid subject"):
        check_pattern(pattern)


@pytest.mark.parametrize("pattern", ["a", "a.*", "a.>", ">", "*.b.>", "llmgw.model.a~2fb.route"])
def test_check_pattern_with_whole_token_wildcards_accepts(pattern: str) -> None:
    check_pattern(pattern)


@pytest.mark.parametrize("queue", ["", "a b"])
def test_check_queue_with_empty_or_spaced_name_raises_value_error(queue: str) -> None:
    with pytest.raises(ValueError, match="invalid queue group"):
        check_queue(queue)


async def test_open_bus_with_empty_or_inproc_url_returns_an_in_process_bus() -> None:
    for url in ("", "inproc://"):
        bus = await open_bus(url)
        assert isinstance(bus, InProcessBus)
        await bus.aclose()


async def test_open_bus_with_unknown_scheme_raises_value_error_naming_accepted_ones() -> None:
    with pytest.raises(ValueError, match=r"inproc://, nats://"):
        await open_bus("redis://localhost")


async def test_subscriber_past_pending_limit_drops_and_counts_without_blocking_publisher(
    bus: InProcessBus,
) -> None:
    async with bus.subscribe("s") as sub:
        for i in range(7):
            await bus.publish("s", probe(str(i)))
        assert (sub.pending, sub.dropped) == (4, 3)
        got = [env async for env in _take(sub, 4)]
        assert [_rid(env) for env in got] == ["0", "1", "2", "3"]
        await bus.publish("s", probe("after"))
        assert [_rid(env) for env in [e async for e in _take(sub, 1)]] == ["after"]
        assert sub.dropped == 3


async def test_slow_consumer_drops_only_its_own_messages(bus: InProcessBus) -> None:
    async with bus.subscribe("s") as slow, bus.subscribe("s") as fast:
        for i in range(6):
            await bus.publish("s", probe(str(i)))
            assert [_rid(e) async for e in _take(fast, 1)] == [str(i)]
        assert (slow.dropped, fast.dropped) == (2, 0)


async def test_queue_group_on_one_subject_takes_turns(bus: InProcessBus) -> None:
    async with bus.subscribe("s", queue="q") as one, bus.subscribe("s", queue="q") as two:
        for i in range(4):
            await bus.publish("s", probe(str(i)))
        assert (one.pending, two.pending) == (2, 2)


async def test_queue_group_spans_members_with_different_patterns(bus: InProcessBus) -> None:
    async with bus.subscribe("a.*", queue="q") as one, bus.subscribe("a.b", queue="q") as two:
        for i in range(4):
            await bus.publish("a.b", probe(str(i)))
        await bus.publish("a.c", probe("only-one"))
        assert (one.pending, two.pending) == (3, 2)


async def test_publish_after_subscribe_reaches_subscriber_despite_cached_empty_route(
    bus: InProcessBus,
) -> None:
    await bus.publish("s", probe("before"))
    async with bus.subscribe("s") as sub:
        await bus.publish("s", probe("after"))
        assert [_rid(e) async for e in _take(sub, 1)] == ["after"]
    with pytest.raises(NoRespondersError):
        await bus.request("s", probe("x"), reply_type=ProbeGrant, timeout=1)


async def test_publish_of_non_message_raises_codec_error_and_delivers_nothing(
    bus: InProcessBus,
) -> None:
    async with bus.subscribe("s") as sub:
        with pytest.raises(CodecError):
            await bus.publish("s", RouteCandidate(endpoint="e", kind="k"))  # type: ignore[arg-type]
        assert sub.pending == 0


async def test_reply_of_unexpected_type_raises_codec_error_at_the_requester(
    bus: InProcessBus,
) -> None:
    async with asyncio.TaskGroup() as tg, bus.subscribe("s") as sub:
        tg.create_task(_answer_once(sub, StateRequest()))
        with pytest.raises(CodecError, match="ProbeGrant"):
            await bus.request("s", probe("x"), reply_type=ProbeGrant, timeout=5)


async def test_publish_and_request_run_no_python_code_of_the_codec(bus: InProcessBus) -> None:
    # The bus calls msgspec's encoder and decoder directly and the Envelope is built by
    # msgspec's C constructor: on the sender's side no frame of bus/codec.py runs (the
    # calls one request makes, issue #30) once the reply type's decoder is made (a cached
    # Python call, the first time only). The responder's side is another task.
    me = asyncio.current_task()
    ran: list[str] = []
    codec.reply_decoder(ProbeGrant)  # made once per reply type, by whichever test asks first

    def profile(frame: FrameType, event: str, arg: object) -> None:
        code = frame.f_code
        if event == "call" and code.co_filename == codec.__file__:
            if asyncio.current_task() is me:
                ran.append(code.co_name)

    async with (
        asyncio.TaskGroup() as tg,
        bus.subscribe("events") as events,
        bus.subscribe("s") as sub,
    ):
        tg.create_task(_answer_once(sub, ProbeGrant(granted=True)))
        sys.setprofile(profile)
        try:
            await bus.publish("events", probe("event"))
            reply = await bus.request("s", probe("x"), reply_type=ProbeGrant, timeout=5)
        finally:
            sys.setprofile(None)
        assert [_rid(e) async for e in _take(events, 1)] == ["event"]
    assert reply == ProbeGrant(granted=True)
    assert ran == []


async def test_request_pending_when_bus_closes_raises_bus_closed(bus: InProcessBus) -> None:
    async with bus.subscribe("s") as sub:
        pending = asyncio.create_task(
            bus.request("s", probe("x"), reply_type=ProbeGrant, timeout=60)
        )
        [env] = [e async for e in _take(sub, 1)]
        await bus.aclose()
        with pytest.raises(BusClosedError):
            await pending
        with pytest.raises(BusClosedError):
            await env.respond(ProbeGrant(granted=True))


async def test_reply_after_request_timed_out_is_dropped_silently(bus: InProcessBus) -> None:
    async with bus.subscribe("s") as sub:
        with pytest.raises(RequestTimeoutError, match=r"no reply on s within 0\.01s"):
            await bus.request("s", probe("x"), reply_type=ProbeGrant, timeout=0.01)
        [env] = [e async for e in _take(sub, 1)]
        await env.respond(ProbeGrant(granted=True))


async def test_respond_to_published_message_is_a_no_op(bus: InProcessBus) -> None:
    async with bus.subscribe("s") as sub:
        await bus.publish("s", probe("x"))
        [env] = [e async for e in _take(sub, 1)]
        assert env.reply is None
        await env.respond(ProbeGrant(granted=True))


async def test_iterating_one_subscription_from_two_tasks_raises_runtime_error(
    bus: InProcessBus,
) -> None:
    async with bus.subscribe("s") as sub:
        waiting = asyncio.create_task(anext(aiter(sub)))
        await asyncio.sleep(0)  # let it park on the subscription; not a wait for time
        with pytest.raises(RuntimeError, match="already being iterated"):
            await anext(aiter(sub))
        await bus.publish("s", probe("x"))
        assert _rid(await waiting) == "x"


async def _take(sub: AsyncIterator[Envelope], n: int) -> AsyncIterator[Envelope]:
    async with asyncio.timeout(5):
        for _ in range(n):
            yield await anext(sub)


async def _answer_once(sub: AsyncIterator[Envelope], reply: StateRequest | ProbeGrant) -> None:
    env = await anext(sub)
    await env.respond(reply)


def _rid(env: Envelope) -> str:
    assert isinstance(env.message, ProbeRequest)
    return env.message.request_id


async def test_an_in_process_stream_keeps_at_most_its_cap_whatever_it_is_asked() -> None:
    bus = InProcessBus()
    try:
        await bus.ensure_stream("S", ["t.kept"], max_age=3600, max_msgs=10 * STREAM_MAX_MSGS)
        for i in range(STREAM_MAX_MSGS + 1):
            await bus.publish("t.kept", ConfigChanged(version=str(i)))
        await bus.publish("t.other", ConfigChanged(version="not kept"))
        async with bus.replay("t.>", stream="S", since=0) as sub:
            assert sub.pending == STREAM_MAX_MSGS
            first = await anext(aiter(sub))
        assert isinstance(first.message, ConfigChanged) and first.message.version == "1"
        await bus.delete_stream("S")
        with pytest.raises(BusClosedError):
            async with bus.replay("t.>", stream="S", since=0):
                pass
    finally:
        await bus.aclose()
