"""Limits scaled out on NATS: one ``--role actors`` process owns every counter, two
``--role ingress`` processes serve. Under concurrent load through both, no more requests
reach the upstream than the key's limit allows in the window, and the key's limit (given at
``llmgw keys create --rpm`` before any gateway ran) is loaded by its owner at start. The
lease of an ingress killed mid-request is released by its TTL."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
import yaml

from bus import open_bus
from schemas import subjects
from schemas.limits import LeaseExpired, LimitSettle, LimitSettleBatch
from tests.e2e.conftest import CHAT, HI, WAIT, model, route
from tests.e2e.keys_support import ADMIN, keys_config
from tests.e2e.limits_support import cli_key
from tests.fixtures.gateway import GatewayProcess
from tests.fixtures.upstream import FakeUpstream, Hang

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

pytestmark = [pytest.mark.e2e, pytest.mark.nats]

LIMIT = 7
LOAD = 24


@pytest.fixture
async def processes() -> Any:
    started: list[GatewayProcess] = []
    yield started
    for proc in reversed(started):
        await asyncio.to_thread(proc.stop)


async def _spawn(started: list[GatewayProcess], *args: str) -> GatewayProcess:
    proc = GatewayProcess(["serve", *args])
    started.append(proc)
    return await asyncio.to_thread(proc.start)


async def _settled(settles: AsyncIterator[Any], count: int) -> None:
    """Wait until ``count`` distinct requests were settled on the bus (singly or batched)."""
    seen: set[str] = set()
    while len(seen) < count:
        message = (await anext(settles)).message
        batch = message.settles if isinstance(message, LimitSettleBatch) else (message,)
        seen.update(s.request_id for s in batch if isinstance(s, LimitSettle))


async def test_two_ingresses_under_load_never_admit_more_than_the_key_limit(
    nats_url: str,
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    processes: list[GatewayProcess],
) -> None:
    cfg = keys_config(tmp_path, model("m", route(fake_upstream)), bus={"url": nats_url})
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    key, key_id = await cli_key(tmp_path, "--rpm", str(LIMIT), "--tpm", "1000000")
    common = ["--config", str(path), "--bus", nats_url]
    await _spawn(processes, *common, "--role", "actors")
    one, two = await asyncio.gather(
        _spawn(processes, *common, "--role", "ingress", "--port", "0"),
        _spawn(processes, *common, "--role", "ingress", "--port", "0"),
    )
    auth = {"authorization": f"Bearer {key}"}
    watch = await open_bus(nats_url, name="test-settles")
    async with (
        watch.subscribe(subjects.LIMITS_SETTLE) as settles,
        httpx.AsyncClient(timeout=WAIT, headers=auth) as client,
    ):

        async def ask(url: str) -> httpx.Response:
            return await client.post(f"{url}{CHAT}", json={"model": "m", "messages": HI})

        answers = await asyncio.gather(*(ask(one.url if i % 2 else two.url) for i in range(LOAD)))
        statuses = Counter(r.status_code for r in answers)
        assert statuses == {200: LIMIT, 429: LOAD - LIMIT}
        assert len(fake_upstream.requests) == LIMIT  # counted where it matters
        refused = [r for r in answers if r.status_code == 429]
        assert all(r.json()["error"]["code"] == "rate_limited" for r in refused)
        assert all(1 <= int(r.headers["retry-after"]) <= 60 for r in refused)
        # An ingress settles a lease after its answer went out: the owner's in-flight count
        # is exact once every admitted request's settle has reached it.
        with anyio.fail_after(WAIT):
            await _settled(aiter(settles), LIMIT)
        admin = {"authorization": f"Bearer {ADMIN}"}
        got = (await client.get(f"{one.url}/admin/limits/key/{key_id}", headers=admin)).json()
    await watch.aclose()
    assert got["limit"]["rpm"] == LIMIT
    assert got["usage"]["requests_last_minute"] == LIMIT
    assert got["usage"]["in_flight"] == 0


async def test_the_lease_of_a_killed_ingress_is_released_by_its_ttl(
    nats_url: str,
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    processes: list[GatewayProcess],
) -> None:
    cfg = keys_config(
        tmp_path,
        model("m", route(fake_upstream)),
        bus={"url": nats_url},
        limits={"lease_ttl_seconds": 1.0},
    )
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    key, _ = await cli_key(tmp_path, "--concurrency", "1")
    common = ["--config", str(path), "--bus", nats_url]
    await _spawn(processes, *common, "--role", "actors")
    one, two = await asyncio.gather(
        _spawn(processes, *common, "--role", "ingress", "--port", "0"),
        _spawn(processes, *common, "--role", "ingress", "--port", "0"),
    )
    fake_upstream.enqueue(Hang())
    bus = await open_bus(nats_url, name="test-watch")
    auth = {"authorization": f"Bearer {key}"}
    body = {"model": "m", "messages": HI}
    try:
        async with (
            bus.subscribe(subjects.event("limits")) as events,
            httpx.AsyncClient(timeout=WAIT, headers=auth) as client,
        ):
            hung = asyncio.create_task(client.post(f"{one.url}{CHAT}", json=body))
            await fake_upstream.wait_for_requests(1)
            busy = await client.post(f"{two.url}{CHAT}", json=body)
            assert busy.status_code == 429  # the slot is held by the request on ingress one
            assert one.proc is not None
            one.proc.kill()  # the ingress dies holding the lease: no settle ever comes
            with contextlib.suppress(httpx.HTTPError):
                await hung
            with anyio.fail_after(WAIT):
                expired = (await anext(aiter(events))).message
            assert isinstance(expired, LeaseExpired)
            freed = await client.post(f"{two.url}{CHAT}", json=body)
            assert freed.status_code == 200, freed.text
    finally:
        await bus.aclose()
