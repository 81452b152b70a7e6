"""A replay (JetStream ordered consumer) outlives a restart of its NATS server.

The server forgets the replay's consumer when it restarts; nats-py makes a new one once two
heartbeats are missed. The replay then goes on after the last event it delivered (none twice),
or from its start time when it had delivered none, rather than staying silent for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

import pytest

from bus import NatsBus, Subscription
from schemas import ModeChanged, subjects
from tests.fixtures.nats import start_nats_server

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.nats

WAIT_S = 10.0


def _mode(name: str) -> ModeChanged:
    return ModeChanged(mode=name, since=0.0, ratio=1.0)


async def _collect(sub: Subscription, into: list[str], arrived: asyncio.Event) -> None:
    async for env in sub:
        assert isinstance(env.message, ModeChanged)
        into.append(env.message.mode)
        arrived.set()


async def _until(check: list[str], arrived: asyncio.Event, pub: NatsBus, sent: list[str]) -> None:
    # Publishes a new event every 0.2 s (one sent while the server is down may be lost)
    # until ``check`` holds one of them: its arrival ends the wait at once.
    async with asyncio.timeout(WAIT_S):
        while not set(check) & set(sent):
            arrived.clear()
            sent.append(f"new-{len(sent)}")
            with contextlib.suppress(Exception):  # refused while pub's connection is down
                await pub.publish(subjects.event("mode"), _mode(sent[-1]))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.2):
                    await arrived.wait()


async def test_a_replay_goes_on_after_its_server_restarted(tmp_path: Path) -> None:
    store = tmp_path / "nats"
    first: list[str] = []
    late: list[str] = []
    with contextlib.ExitStack() as server:
        url = server.enter_context(start_nats_server(store))
        async with contextlib.AsyncExitStack() as stack:
            pub = await NatsBus.connect(url, name="pub")
            stack.push_async_callback(pub.aclose)
            bus = await NatsBus.connect(url, name="replayer")
            stack.push_async_callback(bus.aclose)
            stream = subjects.EVENTS_STREAM
            await pub.ensure_stream(stream, [subjects.EVENTS_ANY], max_age=600, max_msgs=100)
            await pub.publish(subjects.event("mode"), _mode("old"))
            since = time.time() - 60
            sub = await stack.enter_async_context(
                bus.replay(subjects.EVENTS_ANY, stream=stream, since=since)
            )
            first_in, late_in = asyncio.Event(), asyncio.Event()
            async with asyncio.TaskGroup() as tg:
                readers = [tg.create_task(_collect(sub, first, first_in))]
                async with asyncio.timeout(WAIT_S):
                    await first_in.wait()
                assert first == ["old"]
                # Kept before now: a replay from now on has delivered nothing at the restart.
                late_sub = await stack.enter_async_context(
                    bus.replay(subjects.EVENTS_ANY, stream=stream, since=time.time())
                )
                readers.append(tg.create_task(_collect(late_sub, late, late_in)))

                server.close()
                server.enter_context(start_nats_server(store, port=int(url.rsplit(":", 1)[1])))
                sent: list[str] = []
                await _until(first, first_in, pub, sent)
                await _until(late, late_in, pub, sent)
                for reader in readers:
                    reader.cancel()

    assert first[0] == "old" and first.count("old") == 1
    assert first[1:] == [m for m in sent if m in first]  # in order, none twice
    assert "old" not in late and late == [m for m in sent if m in late]
