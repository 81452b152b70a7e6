"""A request body sent gzipped or deflated is decoded, within the body limit once decoded.

OpenAI's API takes compressed request bodies, and clients that send large histories compress
them; the gateway answered such a body "not valid JSON". It now decodes gzip and deflate,
never past ``server.max_body_bytes`` (a small body that inflates past it, a zip bomb, is a
413), and answers any other coding 415 naming it, with ``Accept-Encoding`` saying which it
takes (RFC 7694). Through the official ``openai`` SDK (its transport compressing the body)
and raw HTTP, against the scriptable fake upstream, on the in-process bus.
"""

from __future__ import annotations

import gzip
import json
import zlib
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.e2e.conftest import CHAT, HI, ONE_BUS, assert_openai_error, config, model, route

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

LIMIT = 64 * 1024


class _Gzipping(httpx.AsyncBaseTransport):
    """httpx's transport, sending each request body gzipped."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = gzip.compress(await request.aread())
        headers = {**request.headers, "content-encoding": "gzip"}
        headers["content-length"] = str(len(body))
        sent = httpx.Request(request.method, request.url, headers=headers, content=body)
        return await self._inner.handle_async_request(sent)

    async def aclose(self) -> None:
        await self._inner.aclose()


@pytest.fixture
async def gw(gateway_factory: GatewayFactory, fake_upstream: FakeUpstream) -> RunningGateway:
    return await gateway_factory(
        config(model("m", route(fake_upstream)), server={"max_body_bytes": LIMIT})
    )


async def test_gzipped_body_from_the_sdk_is_served(
    gw: RunningGateway, fake_upstream: FakeUpstream
) -> None:
    client = gw.openai(http_client=httpx.AsyncClient(transport=_Gzipping()))

    answer = await client.chat.completions.create(model="m", messages=HI)

    assert answer.choices[0].message.content
    assert fake_upstream.requests[-1].json["messages"] == HI


async def test_deflated_body_is_served(gw: RunningGateway, fake_upstream: FakeUpstream) -> None:
    body = zlib.compress(json.dumps({"model": "m", "messages": HI}).encode())

    resp = await gw.http().post(CHAT, content=body, headers=_encoded("deflate"))

    assert resp.status_code == 200, resp.text
    assert fake_upstream.requests[-1].json["messages"] == HI


async def test_body_inflating_past_the_limit_is_413(
    gw: RunningGateway, fake_upstream: FakeUpstream
) -> None:
    padded: Any = {"model": "m", "messages": HI, "user": " " * (LIMIT * 100)}
    bomb = gzip.compress(json.dumps(padded).encode())
    assert len(bomb) < LIMIT

    resp = await gw.http().post(CHAT, content=bomb, headers=_encoded("gzip"))

    assert_openai_error(resp, 413, "request_too_large")
    assert fake_upstream.requests == []


async def test_other_codings_and_broken_data_are_refused(
    gw: RunningGateway, fake_upstream: FakeUpstream
) -> None:
    body = json.dumps({"model": "m", "messages": HI}).encode()

    brotli = await gw.http().post(CHAT, content=body, headers=_encoded("br"))
    broken = await gw.http().post(CHAT, content=body, headers=_encoded("gzip"))

    err = assert_openai_error(brotli, 415, "unsupported_encoding")
    assert "'br'" in err["message"]
    assert brotli.headers["accept-encoding"] == "gzip, deflate"
    assert "gzip" in assert_openai_error(broken, 400, "invalid_request")["message"]
    assert fake_upstream.requests == []


def _encoded(coding: str) -> dict[str, str]:
    return {"content-type": "application/json", "content-encoding": coding}
