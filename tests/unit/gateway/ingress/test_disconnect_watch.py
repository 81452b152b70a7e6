"""The disconnect watch: a request that lasts past WATCH_AFTER listens on the client's
ASGI receive and is cancelled when it says ``http.disconnect``; one answered sooner never
calls receive (on granian a waiting receive costs round trips between threads)."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio

from gateway.ingress.pipeline import WATCH_AFTER, _DisconnectWatch


class _Client:
    """An ASGI receive whose answers the test gives, one per call."""

    def __init__(self) -> None:
        self.calls = 0
        self.called = asyncio.Event()
        self.answers: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def receive(self) -> dict[str, Any]:
        self.calls += 1
        self.called.set()
        return await self.answers.get()


async def test_a_request_done_before_its_watch_starts_never_calls_receive() -> None:
    client = _Client()
    scope = anyio.CancelScope()
    watch = _DisconnectWatch(client, scope)  # type: ignore[arg-type]
    watch.serving()
    watch.cancel()  # the request ended at once
    assert watch._start is not None and watch._start.cancelled()  # it will not fire
    assert client.calls == 0
    assert not scope.cancel_called


async def test_a_longer_request_is_cancelled_when_the_client_goes_away() -> None:
    client = _Client()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with anyio.CancelScope() as scope:
        watch = _DisconnectWatch(client, scope)  # type: ignore[arg-type]
        watch.serving()
        await client.called.wait()
        assert loop.time() - started >= WATCH_AFTER
        # Granian's first answer after the body is an empty request message: heard, and
        # the watch listens again.
        await client.answers.put({"type": "http.request", "body": b"", "more_body": False})
        await client.answers.put({"type": "http.disconnect"})
        await anyio.sleep_forever()
    watch.cancel()
    assert scope.cancelled_caught
    assert client.calls == 2
