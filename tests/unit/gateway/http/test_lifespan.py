"""Driving an app's ASGI lifespan by hand (gateway/http/lifespan.py): started, stopped, a
refused start and a raising lifespan reported, an app without lifespan support started."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.http.lifespan import Lifespan, LifespanError


async def test_an_app_is_started_then_stopped() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            kind = (await receive())["type"]
            seen.append(kind)
            if kind == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return

    lifespan = Lifespan(app)
    await lifespan.startup()
    assert seen == ["lifespan.startup"]
    await lifespan.shutdown()
    assert seen == ["lifespan.startup", "lifespan.shutdown"]


async def test_a_refused_start_raises_with_the_apps_message() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no database"})

    with pytest.raises(LifespanError, match="no database"):
        await Lifespan(app).startup()


async def test_a_lifespan_that_raises_is_reported() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        raise ValueError("broken config")

    with pytest.raises(LifespanError, match="broken config"):
        await Lifespan(app).startup()


async def test_an_app_without_lifespan_support_counts_as_started() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        return  # an HTTP-only app ignores the lifespan scope

    lifespan = Lifespan(app)
    await lifespan.startup()
    await lifespan.shutdown()  # nothing to stop: returns at once
