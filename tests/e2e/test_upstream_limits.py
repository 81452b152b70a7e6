"""What an upstream may send is bounded: past a bound the attempt fails as the upstream's
(a 502, the next route tried), and nothing escapes the upstream client's callbacks.

A raw upstream (exact bytes) serves first; a well-behaved fake upstream is the fallback.
Raw httpx on loopback; ``caplog`` checks that no traceback and no asyncio "Fatal error" was
logged.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import CHAT, chat, config, model, route
from tests.fixtures.raw_upstream import RawReply, ok

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.raw_upstream import RawUpstream
    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e

TINY = 1e-6  # a fallback's weight: the draw picks the raw upstream first
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
ANSWER = (
    b'{"id": "c", "object": "chat.completion", "created": 1, "model": "x", "choices": '
    b'[{"index": 0, "message": {"role": "assistant", "content": "raw"}, "finish_reason": "stop"}]}'
)


def raw_route(up: RawUpstream, **extra: Any) -> dict[str, Any]:
    """An ``openai_compat`` route to raw upstream ``up``."""
    return {
        "kind": "openai_compat",
        "base_url": f"http://127.0.0.1:{up.port}/v1",
        "provider_model_id": "raw-model",
        **extra,
    }


async def _gateway(
    gateway_factory: GatewayFactory, *routes: dict[str, Any], **extra: Any
) -> RunningGateway:
    return await gateway_factory(config(model("m", *routes), **extra))


def _no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    problems = [r for r in caplog.records if r.exc_info or "Fatal error" in r.getMessage()]
    assert problems == [], [r.getMessage() for r in problems]


async def test_an_upstream_flooding_interim_answers_fails_over_with_nothing_escaping(
    gateway_factory: GatewayFactory,
    raw_upstream: RawUpstream,
    fake_upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    raw_upstream.enqueue(RawReply(CONTINUE * 3000 + ok(ANSWER, "Content-Type: application/json")))
    gw = await _gateway(gateway_factory, raw_route(raw_upstream), route(fake_upstream, TINY))
    async with gw.http() as client:
        resp = await client.post(CHAT, json=chat())
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"].startswith("Hello from")
    assert len(raw_upstream.requests) == 1 and len(fake_upstream.requests) == 1
    _no_traceback(caplog)


async def test_a_handful_of_interim_answers_precede_the_answer_that_is_served(
    gateway_factory: GatewayFactory, raw_upstream: RawUpstream
) -> None:
    raw_upstream.enqueue(CONTINUE * 3 + ok(ANSWER, "Content-Type: application/json"))
    gw = await _gateway(gateway_factory, raw_route(raw_upstream))
    async with gw.http() as client:
        resp = await client.post(CHAT, json=chat())
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "raw"
