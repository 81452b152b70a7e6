"""A byte relay in the gateway's place: what the machine charges for a process in the path.

``python -m tests.benchmarks.relay --upstream http://127.0.0.1:PORT`` listens on a loopback
port (printed as ``relay listening on http://127.0.0.1:PORT``) and, for each connection it
accepts, opens one connection to the upstream and copies bytes both ways until either side
closes: no HTTP parsing, no routing, one Python process on uvloop with asyncio protocols.

``bench.py --targets direct,floor,gateway`` measures it beside the gateway (pinned to the
gateway's cores). The requests it carries make the same two extra loopback hops and the same
wake-ups a gateway's do, so at concurrency 1 ``floor - direct`` is the machine's price for
any Python process in the path and ``gateway - floor`` the gateway's own. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import cast
from urllib.parse import urlsplit

import uvloop

__all__ = ["Side", "main", "serve"]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class Side(asyncio.Protocol):
    """One connection of a relayed pair; what it reads is written to its ``peer``. Reading
    pauses while the peer's send buffer is full (backpressure, as a proxy must) and either
    side's close closes the other once what it still has to send is out."""

    def __init__(self, peer: Side | None = None) -> None:
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self.early: list[bytes] = []  # read before the peer's connection was made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.early.append(data)
            return
        peer.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()  # closes after the buffered bytes are sent

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def joined(self, peer: Side) -> None:
        """``peer`` is connected: send it what arrived meanwhile."""
        self.peer = peer
        assert peer.transport is not None
        for data in self.early:
            peer.transport.write(data)
        self.early.clear()


async def _open_upstream(client: Side, host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    try:
        _, upstream = await loop.create_connection(lambda: Side(client), host, port)
    except OSError:
        if client.transport is not None:
            client.transport.close()
        return
    if client.transport is None or client.transport.is_closing():
        if upstream.transport is not None:
            upstream.transport.close()  # the client left meanwhile
        return
    client.joined(upstream)


async def serve(upstream: str, port: int = 0, ready: asyncio.Future[int] | None = None) -> None:
    """Relay connections on ``127.0.0.1:port`` to ``upstream`` (an ``http://`` URL on
    loopback) until cancelled; ``ready`` gets the port listened on. Raises ValueError for
    an upstream that is not on loopback."""
    parts = urlsplit(upstream)
    if parts.hostname not in _LOOPBACK or parts.port is None:
        raise ValueError(f"the relay only reaches a loopback upstream with a port: {upstream}")
    host, up_port = parts.hostname, parts.port
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[None]] = set()

    def accepted() -> Side:
        client = Side()
        task = loop.create_task(_open_upstream(client, host, up_port))
        pending.add(task)
        task.add_done_callback(pending.discard)
        return client

    server = await loop.create_server(accepted, "127.0.0.1", port)
    async with server:
        bound = server.sockets[0].getsockname()[1]
        if ready is not None:
            ready.set_result(bound)
        await asyncio.Future()  # until cancelled


async def _main(upstream: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[int] = loop.create_future()
    relay = loop.create_task(serve(upstream, port, ready))
    loop.add_signal_handler(signal.SIGTERM, relay.cancel)
    print(f"relay listening on http://127.0.0.1:{await ready}", flush=True)
    try:
        await relay
    except asyncio.CancelledError:
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.relay")
    p.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    uvloop.run(_main(args.upstream, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
