"""Driving an ASGI app's lifespan by hand, for whatever runs the app without a server that
does it (the builtin engine, ``llmgw replay``).

:class:`Lifespan` owns the app's lifespan task and the two queues it talks over.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine, MutableMapping

    Message = MutableMapping[str, Any]
    ASGIApp = Callable[..., Awaitable[None]]


class LifespanError(RuntimeError):
    """The app refused to start (``lifespan.startup.failed``) or its lifespan raised."""


class Lifespan:
    """The app's ASGI lifespan, run on a task of its own: :meth:`startup`, later
    :meth:`shutdown`."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._replies: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        """Start the app. Raises LifespanError if it refuses or its lifespan raises; an app
        without lifespan support (its lifespan returns at once) counts as started."""
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}}
        running = self._app(scope, self._inbox.get, self._replies.put)
        call = cast("Coroutine[Any, Any, None]", running)
        self._task = asyncio.get_running_loop().create_task(call, name="llmgw:lifespan")
        await self._inbox.put({"type": "lifespan.startup"})
        try:
            reply = await self._reply()
        except asyncio.CancelledError:
            # A start given up (the process stops): so is the app's, and what it started,
            # before anything it uses (the bus) is closed under it.
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            raise
        if reply.get("type") == "lifespan.startup.failed":
            raise LifespanError(str(reply.get("message", "the app failed to start")))

    async def shutdown(self) -> None:
        """Stop the app and wait for its lifespan to end (never raises)."""
        if self._task is None or self._task.done():
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        with contextlib.suppress(Exception):
            await self._reply()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task

    async def _reply(self) -> Message:
        assert self._task is not None
        get = asyncio.ensure_future(self._replies.get())
        await asyncio.wait({get, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if get.done():
            return get.result()
        get.cancel()
        failure = self._task.exception() if not self._task.cancelled() else None
        if failure is not None:
            raise LifespanError(f"the app's lifespan raised {failure!r}") from failure
        return {"type": "lifespan.startup.complete"}  # an app without lifespan support


__all__ = ["Lifespan", "LifespanError"]
