"""A concurrency route's limit across two ingress processes on NATS (one ``--role actors``,
two ``--role ingress``): the upstream never sees a fifth concurrent request, the overflow goes
to the other route, and the slots an ingress held when it was killed come back once their
leases expire (``routing.leases.ttl_seconds``), not before and not never."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httpx
import pytest
import yaml

from bus import open_bus
from schemas import CapacityState, subjects
from tests.e2e.conftest import CHAT, WAIT, Watch, chat, config, eid, model, route
from tests.fixtures.gateway import GatewayProcess
from tests.fixtures.upstream import FakeUpstream, Hang, Held, UpstreamFactory

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.e2e, pytest.mark.nats]

LIMIT = 4
TTL = 6.0  # short, so a dead ingress's leases expire within the test (renewed every 2 s)


async def _spawn(started: list[GatewayProcess], *args: str) -> GatewayProcess:
    proc = GatewayProcess(["serve", *args])
    started.append(proc)
    return await asyncio.to_thread(proc.start)


async def _until(up: FakeUpstream, n: int) -> None:
    await up.wait_for_requests(n, timeout=WAIT)


async def test_the_concurrency_limit_holds_across_two_ingresses_and_a_killed_one_frees_it(
    nats_url: str,
    tmp_path: Path,
    fake_upstreams: UpstreamFactory,
    processes: list[GatewayProcess],
) -> None:
    slots, spare = await fake_upstreams("slots"), await fake_upstreams("spare")
    slots.set_default(Held())
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            config(
                model(
                    "m",
                    route(slots, provider_type="concurrency", concurrency={"limit": LIMIT}),
                    route(spare, fallback_only=True),
                ),
                routing={"leases": {"ttl_seconds": TTL}},
                database={"path": str(tmp_path / "gw.sqlite3")},
            )
        )
    )
    common = ["--config", str(cfg), "--bus", nats_url]
    await _spawn(processes, *common, "--role", "actors")
    one, two = await asyncio.gather(
        _spawn(processes, *common, "--role", "ingress", "--port", "0"),
        _spawn(processes, *common, "--role", "ingress", "--port", "0"),
    )
    pool = eid("m", slots)
    watcher = await open_bus(nats_url, name="test-watcher")
    try:
        async with (
            watcher.subscribe(subjects.capacity_state(pool)) as sub,
            httpx.AsyncClient(base_url=one.url, timeout=WAIT * 3) as via_one,
            httpx.AsyncClient(base_url=two.url, timeout=WAIT * 3) as via_two,
        ):
            states = Watch(sub)
            # Ten concurrent requests, five through each ingress: four are held open by the
            # concurrency route, the other six spill over to the spare route.
            load = [
                asyncio.create_task(c.post(CHAT, json=chat("m")))
                for _ in range(5)
                for c in (via_one, via_two)
            ]
            await asyncio.gather(_until(slots, LIMIT), _until(spare, 10 - LIMIT))
            held_at_once = slots.max_in_flight
            slots.release_held()
            answers = await asyncio.gather(*load)
            await states.next(CapacityState, lambda s: s.used == 0)

            # Ingress one takes every slot with requests that never end, then dies.
            slots.set_default(Hang())
            stuck = [asyncio.create_task(via_one.post(CHAT, json=chat("m"))) for _ in range(LIMIT)]
            await _until(slots, 2 * LIMIT)
            await states.next(CapacityState, lambda s: s.used == LIMIT)
            assert one.proc is not None
            one.proc.kill()
            refused = await via_two.post(CHAT, json=chat("m"))  # the slots are still leased
            freed = await states.next(CapacityState, lambda s: s.used == 0, timeout=TTL + WAIT)
            await slots.wait_for_disconnects(LIMIT, timeout=WAIT)  # the dead ingress's calls
            slots.set_default(Held())
            slots.release_held()
            back = await via_two.post(CHAT, json=chat("m"))
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)
    finally:
        await watcher.aclose()

    assert [a.status_code for a in answers] == [200] * 10
    assert held_at_once == LIMIT
    assert slots.max_in_flight == LIMIT  # never a fifth, before or after the kill
    assert sorted(a.headers["x-routed-via"] for a in answers).count(pool) == LIMIT
    assert refused.headers["x-routed-via"] == eid("m", spare)
    assert freed.used == 0
    assert back.status_code == 200 and back.headers["x-routed-via"] == pool
