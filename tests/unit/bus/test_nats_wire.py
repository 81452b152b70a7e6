"""NatsBus's own reading and writing of the NATS protocol (bus.nats_subscribing): MsgParser's
fast path for MSG lines, and publish_now's writes beside nats-py's own commands."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

import nats
import pytest
from nats.js.api import Header

from bus import NatsBus
from bus.nats_subscribing import DirectClient
from schemas import AdminCommand

if TYPE_CHECKING:
    from nats.aio.msg import Msg

Delivered = tuple[str, str, bytes, dict[str, str] | None]

_BIG = b"MSG a 1 5\r\n" * 40  # a payload that itself reads like protocol lines
_WIRE = b"".join(
    (
        b"MSG llmgw.obs.one 1 5\r\nhello\r\n",
        b"MSG _INBOX.x.7 1 _INBOX.y.8 0\r\n\r\n",
        b"+OK\r\n",
        b"MSG llmgw.other 2 3\r\nnot\r\n",  # no direct subscription: nats-py's path (dropped)
        b"HMSG llmgw.hdr 1 16 19\r\nNATS/1.0 503\r\n\r\nabc\r\n",  # no responders
        b"MSG llmgw.big 1 %d\r\n%s\r\n" % (len(_BIG), _BIG),
        b"MSG llmgw.last 1 _INBOX.z.9 2\r\nok\r\n",
    )
)
_EXPECTED: list[Delivered] = [
    ("llmgw.obs.one", "", b"hello", None),
    ("_INBOX.x.7", "_INBOX.y.8", b"", None),
    ("llmgw.hdr", "", b"abc", {Header.STATUS: "503"}),
    ("llmgw.big", "", _BIG, None),
    ("llmgw.last", "_INBOX.z.9", b"ok", None),
]


async def _read(chunks: list[bytes]) -> list[Delivered]:
    """What a DirectClient with one direct subscription (sid 1) delivers from ``chunks``."""
    nc = DirectClient()
    got: list[Delivered] = []
    nc.direct[1] = lambda s, r, d, h: got.append((s, r, d, h))
    for chunk in chunks:
        await nc._ps.parse(chunk)
    assert not nc._ps.buf  # nothing left over
    return got


async def test_every_message_is_delivered_whole_and_in_order_whatever_the_reads() -> None:
    assert await _read([_WIRE]) == _EXPECTED
    for cut in range(1, len(_WIRE)):
        assert await _read([_WIRE[:cut], _WIRE[cut:]]) == _EXPECTED, cut
    assert await _read([_WIRE[i : i + 1] for i in range(len(_WIRE))]) == _EXPECTED


async def test_a_msg_line_not_as_the_server_writes_it_is_left_to_nats_py() -> None:
    # Two spaces: the fast path's split does not read it; nats-py's regex does.
    assert await _read([b"MSG  llmgw.a  1 2\r\nhi\r\n"]) == [("llmgw.a", "", b"hi", None)]


@pytest.mark.nats
async def test_publishes_keep_their_order_among_nats_py_commands_and_past_a_full_socket(
    nats_url: str,
) -> None:
    # Bursts of several megabytes leave the socket's buffer full, so later writes go through
    # nats-py's flusher (which waits for it to drain); others are nats-py's own publishes.
    subject = f"t{uuid.uuid4().hex}.order"
    reader = await nats.connect(nats_url, pending_size=0)
    bus = await NatsBus.connect(nats_url)
    got: list[str] = []
    done = asyncio.Event()
    total = 6 * 400

    async def on_msg(msg: Msg) -> None:
        got.append(msg.data.decode().split('"request_id":"', 1)[1].split('"', 1)[0])
        if len(got) == total:
            done.set()

    try:
        sub = await reader.subscribe(subject, cb=on_msg, pending_bytes_limit=-1)
        await reader.flush()
        pad = "p" * 8000
        n = 0
        for _burst in range(6):
            for i in range(400):
                if i % 50 == 0:
                    payload = b'{"request_id":"%d"}' % n
                    await bus._nc.publish(subject, payload)  # nats-py's own path, interleaved
                else:
                    await bus.publish(subject, AdminCommand(args={"request_id": f"{n}"}, by=pad))
                n += 1
            await asyncio.sleep(0)  # a turn between bursts: the next meets a flusher part way
        async with asyncio.timeout(30):
            await done.wait()
        await sub.unsubscribe()
    finally:
        await bus.aclose()
        await reader.close()
    assert got == [str(i) for i in range(total)]
