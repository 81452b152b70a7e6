"""What the multi-host e2e tests share: starting ``serve`` processes, writing their configs,
choosing node ids that put given units on one host, reading or awaiting the units' owners
in JetStream, and a relay whose connections to a NATS node can be cut."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import yaml

from actors import build_tree
from actors.cluster import owner_of
from bus import BusClosedError
from gateway.process.config import load_config
from tests.e2e.conftest import PROCESS_WAIT, WAIT
from tests.fixtures.gateway import GatewayProcess

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from bus import KeyValue


def pair_moving_together(*units: str) -> tuple[str, str]:
    """Two node ids under which ``units`` are all placed on the same host (the victim)."""
    for n in range(1, 50):
        pair = ("a", f"b{n}")
        if len({owner_of(u, pair) for u in units}) == 1:
            return pair
    raise AssertionError("no such pair")


async def spawn_serve(started: list[GatewayProcess], *args: str) -> GatewayProcess:
    """A started ``serve`` process (stopped by the ``processes`` fixture, which also ends a
    start still waiting for its ready line)."""
    proc = GatewayProcess(["serve", *args])
    started.append(proc)
    try:
        async with asyncio.timeout(PROCESS_WAIT):
            return await asyncio.to_thread(proc.start)
    except TimeoutError:
        raise AssertionError(f"serve {' '.join(args)} not ready in {PROCESS_WAIT} s") from None


async def spawn_actors(
    started: list[GatewayProcess], config: Path, bus: str, node: str
) -> GatewayProcess:
    """A started ``serve --role actors`` process, actors host ``node`` of the cluster on
    ``bus``."""
    return await spawn_serve(
        started, "--config", str(config), "--bus", bus, "--role", "actors", "--node-id", node
    )


async def spawn_ingress(started: list[GatewayProcess], config: Path, bus: str) -> GatewayProcess:
    """A started ``serve --role ingress`` process on ``bus``, on a free port."""
    return await spawn_serve(
        started, "--config", str(config), "--bus", bus, "--role", "ingress", "--port", "0"
    )


async def owners_of(kv: KeyValue) -> dict[str, str]:
    out: dict[str, str] = {}
    for unit in await kv.keys():
        entry = await kv.get(unit)
        if entry is not None:
            out[unit] = entry.value.decode()
    return out


async def until_owned(kv: KeyValue, units: set[str], by: set[str]) -> dict[str, str]:
    """The owners once every unit has one and the owners are exactly ``by``. Raises
    AssertionError naming the last owners seen when that takes over ``2 * WAIT``.

    Polled, not watched: the callers cut NATS nodes and hosts meanwhile, and nats-py's KV
    watcher is what ``bus/nats_kv.py`` avoids for listings (nats.py #842, #995)."""
    owners: dict[str, str] = {}
    try:
        async with asyncio.timeout(WAIT * 2):
            while True:
                try:
                    owners = await owners_of(kv)
                except BusClosedError:  # a node was lost: the bucket elects a new leader
                    pass  # asked again at the poll's pace, not in a tight loop
                else:
                    if set(owners) == units and set(owners.values()) == by:
                        return owners
                await asyncio.sleep(0.1)  # the owners are in JetStream: poll the outcome
    except TimeoutError:
        raise AssertionError(f"units not owned by {by} in {WAIT * 2} s: {owners}") from None


def write_config(path: Path, body: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(body))
    return str(path)


@dataclass
class Deployment:
    """Actors hosts (one per node id, each with its own SQLite folder and the shared
    PostgreSQL) and one ingress on a NATS cluster."""

    configs: dict[str, str]  # node id -> its config file
    units: set[str]  # the placed units of the tree
    hosts: dict[str, GatewayProcess]
    ingress: GatewayProcess
    bus_url: str


async def deploy(
    started: list[GatewayProcess],
    folder: Path,
    base: dict[str, Any],
    nodes: Iterable[str],
    nats_urls: list[str],
    postgres_url: str,
) -> Deployment:
    """Start an actors host per node of ``nodes`` with ``base`` and an ingress beside them."""
    configs = {
        node: write_config(
            folder / f"{node}.yaml",
            {**base, "database": {"path": str(folder / node), "url": postgres_url}},
        )
        for node in nodes
    }
    first = next(iter(configs.values()))
    units = {s.name for s in build_tree(load_config(first), request_log=True).specs}
    bus_url = ",".join(nats_urls)
    hosts = {
        node: await spawn_serve(
            started, "--config", path, "--bus", bus_url, "--role", "actors", "--node-id", node
        )
        for node, path in configs.items()
    }
    ingress = await spawn_serve(
        started, "--config", first, "--bus", bus_url, "--role", "ingress", "--port", "0"
    )
    return Deployment(configs, units, hosts, ingress, bus_url)


class Relay:
    """A loopback TCP relay to the NATS node at ``url`` whose connections can be cut (both
    ends closed, new ones refused) and restored: what a process sees when its link to its
    server drops and comes back, while the process and the server live on. While it holds
    replies, the messages the server sends to the process's inboxes (the answers to its
    requests: key-value writes, asks) wait, and every other message passes: JetStream slow
    to answer the process, its subscribers served."""

    def __init__(self, url: str) -> None:
        target = urlsplit(url)
        self._target = (target.hostname or "127.0.0.1", target.port or 4222)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._pipes: set[asyncio.Task[None]] = set()
        self._holding = False
        self._held: list[tuple[asyncio.StreamWriter, bytes]] = []
        self.port = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Listen (on the port it had, after a ``cut``)."""
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        """Close every relayed connection and refuse new ones until ``start``."""
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        for pipe in self._pipes:
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        self._writers.clear()

    def hold_replies(self) -> None:
        """Hold the messages to the relayed processes' inboxes until ``release_replies``."""
        self._holding = True

    def release_replies(self) -> None:
        """Send the held inbox messages, in order, and hold no more."""
        self._holding = False
        for writer, frame in self._held:
            if not writer.is_closing():
                writer.write(frame)
        self._held.clear()

    async def _down(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        pending = b""
        try:
            while data := await src.read(65536):
                pending += data
                while (cut := _frame_end(pending)) is not None:
                    frame, pending = pending[:cut], pending[cut:]
                    if self._holding and _to_inbox(frame):
                        self._held.append((dst, frame))
                    else:
                        dst.write(frame)
                await dst.drain()
        except OSError:
            pass
        finally:
            dst.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        for pipe in (
            asyncio.create_task(_pipe(reader, up_writer)),
            asyncio.create_task(self._down(up_reader, writer)),
        ):
            self._pipes.add(pipe)
            pipe.add_done_callback(self._pipes.discard)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except OSError:
        pass
    finally:
        dst.close()


def _frame_end(data: bytes) -> int | None:
    """Where the first whole NATS protocol frame of ``data`` ends (a ``MSG`` or ``HMSG`` with
    its payload, or one line), None when it is not all there yet."""
    line = data.find(b"\r\n")
    if line < 0:
        return None
    head = data[:line].split()
    if head and head[0] in (b"MSG", b"HMSG"):
        end = line + 2 + int(head[-1]) + 2
        return end if len(data) >= end else None
    return line + 2


def _to_inbox(frame: bytes) -> bool:
    head = frame.split(b"\r\n", 1)[0].split()
    return len(head) > 1 and head[0] in (b"MSG", b"HMSG") and head[1].startswith(b"_INBOX")
