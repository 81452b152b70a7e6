"""NatsBus's JetStream additions: a bounded stream of events, and replaying it then following."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import anyio
import pytest

from bus import BusClosedError, NatsBus
from schemas import ConfigChanged, subjects

pytestmark = pytest.mark.nats

WAIT = 5.0


@pytest.fixture
async def nats_bus(nats_url: str) -> AsyncIterator[NatsBus]:
    bus = await NatsBus.connect(nats_url)
    yield bus
    await bus.aclose()


async def test_replay_delivers_what_the_stream_kept_then_live_messages(nats_bus: NatsBus) -> None:
    stream = f"TEST_{time.monotonic_ns()}"
    # Outside llmgw.events.>: a gateway started earlier on the same server keeps its events
    # stream there, and JetStream refuses overlapping streams.
    subject = f"llmgw-test.replay.{time.monotonic_ns()}"
    try:
        await _replay_then_follow(nats_bus, stream, subject)
    finally:
        await nats_bus.delete_stream(stream)


async def _replay_then_follow(nats_bus: NatsBus, stream: str, subject: str) -> None:
    await nats_bus.ensure_stream(stream, [subject], max_age=60, max_msgs=10)
    await nats_bus.ensure_stream(stream, [subject], max_age=120, max_msgs=10)  # an update
    since = time.time() - 1
    for v in ("v1", "v2"):
        await nats_bus.publish(subject, ConfigChanged(version=v))
    got: list[str] = []
    async with nats_bus.replay(subject, stream=stream, since=since) as sub:
        with anyio.fail_after(WAIT):
            async for env in sub:
                assert isinstance(env.message, ConfigChanged)
                got.append(env.message.version)
                if got == ["v1", "v2"]:
                    await nats_bus.publish(subject, ConfigChanged(version="live"))
                if len(got) == 3:
                    break
    assert got == ["v1", "v2", "live"]


async def test_replay_of_a_missing_stream_raises_bus_closed_error(nats_bus: NatsBus) -> None:
    with pytest.raises(BusClosedError):
        async with nats_bus.replay(subjects.event("x"), stream="NO_SUCH_STREAM", since=0):
            pass
