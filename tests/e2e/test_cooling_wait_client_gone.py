"""A client that leaves while its request waits for a cooling route (every route answered 429
with a ``Retry-After``, ``failover.cooling_wait_seconds`` not spent) ends its request there:
its row says 499 ``cancelled``, its key's concurrency slot comes back at once, and nothing
more is sent upstream for it. The wait after a 429 left the row saying 200 with that 429's
error; a request that found the route cooling already waited before the disconnect watch
began, kept its slot for the whole wait, and was then sent for no one. Real HTTP on
loopback; the official SDKs' transport (httpx), cancelled mid-request."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from schemas import RequestCompleted, subjects
from tests.e2e.conftest import HI, WAIT, model, route, watch
from tests.e2e.keys_support import admin_http, keys_config
from tests.e2e.limits_support import new_key, set_limit
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e

COOLING = Reply(429, headers={"retry-after": "3"})
ROUTING = {"failover": {"cooling_wait_seconds": 5}}


async def _in_flight(gw: RunningGateway, key_id: str) -> int:
    resp = await admin_http(gw).get(f"/admin/limits/key/{key_id}")
    assert resp.status_code == 200, resp.text
    return int(resp.json()["usage"]["in_flight"])


async def _limited_key(gw: RunningGateway) -> tuple[str, str]:
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, concurrency=1)
    return key, key_id


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
async def test_a_client_gone_during_the_wait_after_a_429_ends_its_request_as_499(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, tmp_path: Path, stream: bool
) -> None:
    fake_upstream.set_default(COOLING)
    config = keys_config(tmp_path, model("m", route(fake_upstream)), routing=ROUTING)
    gw = await gateway_factory(config)
    key, key_id = await _limited_key(gw)
    body: dict[str, Any] = {"model": "m", "messages": HI, "stream": stream}

    async with watch(gw, subjects.request_done("m")) as done:
        async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as client:
            asking = asyncio.create_task(
                client.post(
                    "/v1/chat/completions",
                    json=body,
                    headers={"authorization": f"Bearer {key}"},
                )
            )
            await fake_upstream.wait_for_requests(1)  # refused: the route cools for 3 s
            asking.cancel()
        ended = await done.next(RequestCompleted)

    assert (ended.status, ended.error_kind) == (499, "cancelled")
    assert await _in_flight(gw, key_id) == 0
    assert len(fake_upstream.requests) == 1


async def test_a_client_gone_while_its_request_waits_for_a_route_already_cooling_sends_nothing(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    fake_upstream.enqueue(COOLING)  # the first request's first attempt: the route cools
    config = keys_config(tmp_path, model("m", route(fake_upstream)), routing=ROUTING)
    gw = await gateway_factory(config)
    key, key_id = await _limited_key(gw)
    admin = admin_http(gw)

    async with watch(gw, subjects.request_done("m")) as done:
        first = asyncio.create_task(
            admin.post("/v1/chat/completions", json={"model": "m", "messages": HI})
        )
        await fake_upstream.wait_for_requests(1)
        async with (
            httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as client,
            watch(gw, subjects.LIMITS_ADMIT) as admissions,
        ):
            asking = asyncio.create_task(
                client.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": HI},
                    headers={"authorization": f"Bearer {key}"},
                )
            )
            await admissions.next(object)  # asked while it waits for the route
            asking.cancel()
        gone = await done.next(RequestCompleted, lambda d: d.key_id == key_id)
        in_flight_after = await _in_flight(gw, key_id)
        served = await first  # the route back: the waiting request is served

    assert (gone.status, gone.error_kind) == (499, "cancelled")
    assert in_flight_after == 0
    assert served.status_code == 200, served.text
    assert len(fake_upstream.requests) == 2  # the 429 and the first request's retry only
