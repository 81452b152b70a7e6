"""What an upstream may send is bounded: past a bound the attempt fails as the upstream's
(a 502, the next route tried), and nothing escapes the upstream client's callbacks.

A raw upstream (exact bytes) serves first; a well-behaved fake upstream is the fallback.
Raw httpx on loopback; ``caplog`` checks that no traceback and no asyncio "Fatal error" was
logged.
"""

from __future__ import annotations

import json
import logging
import zlib
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import (
    CHAT,
    assert_openai_error,
    chat,
    config,
    endpoint_states,
    model,
    route,
)
from tests.fixtures.raw_upstream import RawReply, ok

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.raw_upstream import RawUpstream
    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e

TINY = 1e-6  # a fallback's weight: the draw picks the raw upstream first
BOUND = 1024 * 1024  # server.max_upstream_answer_bytes in these tests (default 256 MiB)
SECRET = "sk-route-secret-0123456789"
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


def gzipped(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def gzip_bomb() -> bytes:
    """A 200 whose gzip body (8 kB) inflates to a valid answer padded to 8 MiB with spaces,
    eight times the bound (unbounded, it was served)."""
    padded = ANSWER[:-1] + b" " * (8 * BOUND) + b"}"
    return ok(gzipped(padded), "Content-Type: application/json", "Content-Encoding: gzip")


def giant_error(status: bytes) -> bytes:
    """An error answer whose JSON message is 2 MiB, twice an error body's bound (1 MiB)."""
    body = json.dumps({"error": {"message": "m" * (2 * BOUND), "type": "server_error"}})
    return ok(body.encode(), "Content-Type: application/json").replace(b"200 OK", status)


SERVER = {"max_upstream_answer_bytes": BOUND}


@pytest.mark.parametrize(
    ("reply", "code"),
    [(gzip_bomb(), "upstream_bad_response"), (giant_error(b"500 Oops"), "upstream_error")],
    ids=["gzip-bomb", "giant-500"],
)
async def test_an_answer_over_its_bound_is_a_502_that_counts_against_the_route(
    gateway_factory: GatewayFactory,
    raw_upstream: RawUpstream,
    caplog: pytest.LogCaptureFixture,
    reply: bytes,
    code: str,
) -> None:
    # A giant 500 is the upstream's error, its body cut at the bound (not a bad response).
    caplog.set_level(logging.DEBUG)
    raw_upstream.enqueue(RawReply(reply, close=True))
    gw = await _gateway(gateway_factory, raw_route(raw_upstream), server=SERVER)
    async with endpoint_states(gw, f"m:local-{raw_upstream.port}") as states, gw.http() as client:
        resp = await client.post(CHAT, json=chat())
        state = await states.state(lambda s: s.consecutive_failures > 0)
    assert_openai_error(resp, 502, code)
    assert len(resp.content) < 3000
    assert state.consecutive_failures == 1  # the upstream's failure, not the client's
    _no_traceback(caplog)


@pytest.mark.parametrize(
    "reply", [gzip_bomb(), giant_error(b"500 Oops")], ids=["gzip-bomb", "giant-500"]
)
async def test_an_answer_over_its_bound_fails_over_to_the_next_route(
    gateway_factory: GatewayFactory,
    raw_upstream: RawUpstream,
    fake_upstream: FakeUpstream,
    reply: bytes,
) -> None:
    raw_upstream.enqueue(RawReply(reply, close=True))
    gw = await _gateway(
        gateway_factory,
        raw_route(raw_upstream),
        route(fake_upstream, TINY),
        server=SERVER,
    )
    async with gw.http() as client:
        resp = await client.post(CHAT, json=chat())
    assert resp.status_code == 200, resp.text
    assert len(raw_upstream.requests) == 1 and len(fake_upstream.requests) == 1


async def test_a_giant_422_stays_the_clients_error(
    gateway_factory: GatewayFactory, raw_upstream: RawUpstream
) -> None:
    # A 422 echoing a large request (FastAPI's does) became a 502 bad response once error
    # bodies were bounded: the upstream's fault, charged to the route.
    raw_upstream.enqueue(RawReply(giant_error(b"422 Unprocessable Entity")))
    gw = await _gateway(gateway_factory, raw_route(raw_upstream), server=SERVER)
    async with gw.http() as client:
        resp = await client.post(CHAT, json=chat())
    assert resp.status_code == 422, resp.text[:300]
    assert len(resp.content) < 3000  # its cut body is no JSON: the status says it all


async def test_an_answer_of_the_bound_compressed_or_not_is_served(
    gateway_factory: GatewayFactory, raw_upstream: RawUpstream
) -> None:
    padded = ANSWER[:-1] + b" " * (BOUND - len(ANSWER)) + b"}"  # exactly the bound
    raw_upstream.enqueue(
        ok(padded, "Content-Type: application/json"),
        ok(gzipped(padded), "Content-Type: application/json", "Content-Encoding: gzip"),
    )
    gw = await _gateway(gateway_factory, raw_route(raw_upstream), server=SERVER)
    async with gw.http() as client:
        for _ in range(2):
            resp = await client.post(CHAT, json=chat())
            assert resp.status_code == 200, resp.text[:200]
            assert resp.json()["choices"][0]["message"]["content"] == "raw"


async def test_a_long_upstream_error_message_reaches_the_client_clipped_and_redacted(
    gateway_factory: GatewayFactory, raw_upstream: RawUpstream
) -> None:
    message = "x" * 1985 + f" {SECRET} " + "y" * 200_000  # the key across the cut
    body = json.dumps({"error": {"message": message, "type": "server_error"}})
    raw_upstream.enqueue(ok(body.encode()).replace(b"200 OK", b"500 Oops"))
    gw = await _gateway(gateway_factory, raw_route(raw_upstream, api_key=SECRET))
    async with gw.http() as client:
        resp = await client.post(CHAT, json=chat())
    err = assert_openai_error(resp, 502)
    assert len(err["message"]) <= 2100 and err["message"].endswith("y\u2026"), err["message"]
    assert "x [redacted] y" in err["message"]
    assert SECRET[:5] not in resp.text and len(resp.content) < 3000
