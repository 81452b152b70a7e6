"""A chat stream from an ``openai_compat`` upstream, as the ingress gets it (through the
redacting seam ``make_adapters`` hands out), starts no async generator: an unfinished one
(a stream ends at ``[DONE]``) is closed by the event loop's finalizer hook, a task per
stream, and each layer of them cost every streamed request."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest

from gateway.adapters.base import UpstreamTarget
from gateway.adapters.registry import make_adapters
from gateway.adapters.upstream_http import UpstreamHTTP
from schemas import UpstreamError
from tests.fixtures.upstream import FakeUpstream, Stream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.fixture
async def http() -> AsyncIterator[UpstreamHTTP]:
    client = UpstreamHTTP()
    yield client
    await client.aclose()


@contextmanager
def _started_generators() -> Iterator[list[str]]:
    """The names of the async generators started inside (the event loop's own hooks still
    run). Entered inside the running test: the loop sets its hooks each time it starts."""
    hooks = sys.get_asyncgen_hooks()
    started: list[str] = []

    def firstiter(agen: Any) -> None:
        started.append(agen.__qualname__)
        if hooks.firstiter is not None:
            hooks.firstiter(agen)

    sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=hooks.finalizer)
    try:
        yield started
    finally:
        sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=hooks.finalizer)


def _target(upstream: FakeUpstream) -> UpstreamTarget:
    return UpstreamTarget(
        endpoint="e",
        kind="openai_compat",
        base_url=upstream.openai_base_url,
        upstream_model="m",
        api_key="sk-secret",
        timeout=5,
        connect_timeout=1,
    )


async def test_openai_compat_stream_to_done_starts_no_async_generator(
    http: UpstreamHTTP, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(Stream(chunks=3))
    with _started_generators() as started_generators:
        stream = make_adapters(http)["openai_compat"].stream(_target(fake_upstream), BODY)
        batches = [batch async for batch in stream]
        await stream.aclose()  # type: ignore[attr-defined]
    assert batches[-1].last and sum(len(b) for b in batches) >= 5
    assert started_generators == []


async def test_openai_compat_stream_in_band_error_is_redacted_after_its_chunks(
    http: UpstreamHTTP, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(Stream(chunks=3, error_after=2, error="bad key {authorization}"))
    chunks = 0
    with _started_generators() as started_generators, pytest.raises(UpstreamError) as raised:
        stream = make_adapters(http)["openai_compat"].stream(_target(fake_upstream), BODY)
        async for batch in stream:
            chunks += len(batch)
    assert chunks == 3  # the role chunk and two deltas reached the relay first
    assert "sk-secret" not in raised.value.message and "[redacted]" in raised.value.message
    assert started_generators == []
