"""The serving process tells sniffio its library (gateway.process.serve.declare_asyncio)."""

from __future__ import annotations

import asyncio
import contextvars

import sniffio

from gateway.process.serve import declare_asyncio


async def test_declare_asyncio_holds_for_tasks_started_after_it_and_not_for_the_caller() -> None:
    async def serving() -> str | None:
        declare_asyncio()
        child = asyncio.create_task(_library())
        return await child

    async def _library() -> str | None:
        return sniffio.current_async_library_cvar.get()

    # The gateway's own task (as the tests start it): the caller's context stays as it was.
    seen = await asyncio.create_task(serving(), context=contextvars.copy_context())
    assert seen == "asyncio"
    assert sniffio.current_async_library_cvar.get() is None
    assert sniffio.current_async_library() == "asyncio"  # sniffed, as before
