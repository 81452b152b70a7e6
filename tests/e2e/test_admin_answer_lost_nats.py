"""An admin command whose answer the gateway's NATS connection lost, the connection back within
the reconnect grace: the gateway sends the command again under the same request id, and its
owner answers with the first run's answer rather than run it twice, so the operator gets
that answer in about a second instead of a 503 after the 30 s admin timeout.

The gateway reaches NATS through a relay the test cuts; the area's owner, a real
``AdminArea`` on a connection of its own (another process, as in a cluster), finishes the
command while the gateway is cut off, so its answer goes to an inbox nobody holds."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, cast

import anyio
import httpx
import pytest

import gateway.admin.http
from actors.admin import AdminArea
from bus import NatsBus
from schemas import AdminCommand, GatewayError, ModeRequest, subjects
from tests.e2e.conftest import WAIT, config, model
from tests.fixtures.gateway import start_gateway
from tests.fixtures.nats import until_connected

if TYPE_CHECKING:
    from actors.base import ActorContext
    from schemas import Message

pytestmark = [pytest.mark.e2e, pytest.mark.nats]

ADMIN = "adm-answer-lost-key"
ANSWERED_WITHIN_S = 15.0  # the admin timeout is 30 s: an answer waited out fails here


class _Relay:
    """A TCP relay from a loopback port to NATS that the test cuts (its connections closed,
    new ones refused) and opens again on the same port."""

    def __init__(self, target: int) -> None:
        self._target = target
        self._server: asyncio.Server | None = None
        self._sides: list[asyncio.StreamWriter] = []
        self._pipes: set[asyncio.Task[Any]] = set()
        self.port = 0

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        """Refuse new connections, close those open, and return once their pipes ended."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for side in self._sides:
            side.close()
        self._sides.clear()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target)
            self._sides += [writer, up_writer]
            await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
        finally:
            writer.close()
            self._pipes.discard(task)


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


class _Owner:
    """The ``slowlost`` area's owner: ``apply`` waits for ``release``, then answers its run count;
    a mailbox of one, as an actor's."""

    def __init__(self, bus: NatsBus) -> None:
        self.bus = bus
        self.runs = 0
        self.started = anyio.Event()
        self.release = anyio.Event()
        self.area = AdminArea("slowlost", {"apply": self._apply})
        self.answered = 0
        self.first_answered = anyio.Event()

    async def _apply(self, cmd: AdminCommand) -> dict[str, Any]:
        self.runs += 1
        self.started.set()
        await self.release.wait()
        return {"runs": self.runs}

    async def publish(self, subject: str, msg: Message) -> None:
        await self.bus.publish(subject, msg)

    async def serve(self, ready: anyio.Event) -> None:
        async with self.bus.subscribe(subjects.admin_area("slowlost")) as commands:
            ready.set()
            async for env in commands:
                try:
                    await self.area.answer(cast("ActorContext", self), env)
                except GatewayError as err:
                    await env.respond(err.to_reply())
                self.answered += 1
                self.first_answered.set()


async def test_an_answer_lost_with_the_connection_is_asked_for_again_and_run_once(
    nats_url: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loaded machine may take longer than 2 s to reconnect through the relay: the grace is
    # what this test is not about.
    monkeypatch.setattr(gateway.admin.http, "RECONNECT_GRACE_S", 10.0)
    relay = _Relay(int(nats_url.rsplit(":", 1)[1]))
    await relay.open()
    gw = await start_gateway(
        config(model("m", {"kind": "echo"}), admin_key=ADMIN),
        f"nats://127.0.0.1:{relay.port}",
        data_dir=tmp_path,
    )
    owner = _Owner(await NatsBus.connect(nats_url))
    try:
        assert gw.bus is not None
        async with (
            anyio.create_task_group() as tg,
            httpx.AsyncClient(
                base_url=gw.url, headers={"authorization": f"Bearer {ADMIN}"}, timeout=60
            ) as http,
        ):
            ready = anyio.Event()
            tg.start_soon(owner.serve, ready)
            await ready.wait()
            sent = asyncio.create_task(http.post("/admin/slowlost/apply", json={}))
            with anyio.fail_after(WAIT):
                await owner.started.wait()
            await relay.cut()
            await until_connected(gw.bus, False)
            owner.release.set()  # the answer goes out while the gateway is cut off
            with anyio.fail_after(WAIT):
                await owner.first_answered.wait()
            # A round trip on the owner's connection: its answer reached NATS, and was dropped.
            with pytest.raises(GatewayError):
                await owner.bus.request(
                    "test.nobody", ModeRequest(), reply_type=ModeRequest, timeout=WAIT
                )
            await relay.open()
            with anyio.fail_after(ANSWERED_WITHIN_S):
                answer = await sent
            tg.cancel_scope.cancel()
    finally:
        await owner.bus.aclose()
        await gw.stop()
        await relay.cut()

    assert answer.status_code == 200, answer.text
    assert answer.json() == {"runs": 1}
    assert (owner.runs, owner.answered) == (1, 2)  # the copy was answered, not run
