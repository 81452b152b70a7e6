"""Gateway API keys, limits and budgets survive a takeover of their owner (kill -9).

Two ``--role actors`` hosts and one ingress on a three-node NATS cluster (JetStream, R3);
each host has its own SQLite file, so only what is in JetStream can reach the host that
takes over. Keys are made and limited through the admin API, some of each limit is used,
then the host owning the ``api_keys`` and ``limits`` units is killed. After the takeover:
the keys still authenticate, the limits are still set, a budget nearly spent stays nearly
spent (one more request spends it), an RPM limit counts what was admitted before the kill
(no more reach the upstream in the minute than it allows), and a concurrency slot held
through the kill stays held (a second request is refused while the first runs)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from actors.cluster import OWNERS_BUCKET
from bus import open_bus
from tests.e2e.cluster_support import deploy, pair_moving_together, until_owned
from tests.e2e.conftest import CHAT, HI, WAIT, config, model, route
from tests.e2e.test_cluster_takeover_multiprocess_nats import CLUSTER
from tests.fixtures.upstream import Held

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayProcess
    from tests.fixtures.nats import NatsCluster
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = [pytest.mark.e2e, pytest.mark.nats]

ADMIN = "cluster-admin-key"
RPM = 5
BEFORE = 3  # requests of the RPM key answered before the kill
PRICING = {"prompt": 2.0, "completion": 10.0}  # USD per million tokens
# A request costs (10 * 2 + 5 * 10) / 1e6 = 70 micro-USD and reserves about as much: after
# two, one more no longer fits the budget (it would if the spend were forgotten).
COST = 70e-6
BUDGET = 180e-6


async def _make_key(admin: httpx.AsyncClient, user: str, **limit: Any) -> tuple[str, str]:
    """(key, key id) of a new key of ``user`` limited by ``limit``, through the admin API."""
    made = await admin.post("/admin/keys", json={"org": "acme", "user": user, "role": "pro"})
    assert made.status_code == 201, made.text
    key, key_id = made.json()["key"], made.json()["id"]
    limited = await admin.put(f"/admin/limits/key/{key_id}", json=limit)
    assert limited.status_code == 200, limited.text
    return key, key_id


async def _ask(
    http: httpx.AsyncClient, key: str, model_id: str = "m", timeout: float = WAIT
) -> httpx.Response:
    return await http.post(
        CHAT,
        json={"model": model_id, "messages": HI, "max_tokens": 5},
        headers={"authorization": f"Bearer {key}"},
        timeout=timeout,
    )


async def _usage(admin: httpx.AsyncClient, key_id: str) -> dict[str, Any]:
    got = await admin.post("/admin/limits/get", json={"kind": "key", "id": key_id})
    assert got.status_code == 200, got.text
    body: dict[str, Any] = got.json()
    return body


async def _until_spent(admin: httpx.AsyncClient, key_id: str, expected: float) -> float:
    """The key's spend once its settles reached ``expected`` (settles are sent after the
    answer). Raises AssertionError after ``WAIT``."""
    deadline = time.monotonic() + WAIT
    while (spent := (await _usage(admin, key_id))["usage"]["spent_usd"]) < expected * 0.999:
        assert time.monotonic() < deadline, f"spent {spent}, expected {expected}"
        await asyncio.sleep(0.05)  # polling the owner's answer, bounded by WAIT
    return float(spent)


@pytest.mark.timeout(120)
async def test_keys_limits_and_budgets_outlive_a_killed_owner(
    nats_cluster: NatsCluster,
    postgres_url: str,
    tmp_path: Path,
    fake_upstreams: UpstreamFactory,
    processes: list[GatewayProcess],
) -> None:
    up, slow = await fake_upstreams("up"), await fake_upstreams("slow")
    base = config(
        model("m", route(up, pricing=PRICING)),
        model("c", route(slow)),
        admin_key=ADMIN,
        cluster=CLUSTER,
        auth_cache_seconds=0,  # every request asks the keys' owner
    )
    nodes = pair_moving_together("api_keys", "limits")
    dep = await deploy(processes, tmp_path, base, nodes, nats_cluster.urls, postgres_url)
    units, hosts, ingress = dep.units, dep.hosts, dep.ingress
    watcher = await open_bus(nats_cluster.urls[1], name="test-watcher")
    admin = httpx.AsyncClient(
        base_url=ingress.url, timeout=WAIT, headers={"authorization": f"Bearer {ADMIN}"}
    )
    http = httpx.AsyncClient(base_url=ingress.url, timeout=WAIT)
    try:
        kv = await watcher.key_value(OWNERS_BUCKET, replicas=3)
        split = await until_owned(kv, units, set(nodes))
        victim = split["limits"]
        survivor = nodes[1] if victim == nodes[0] else nodes[0]

        # A budget nearly spent.
        spender, spender_id = await _make_key(admin, "spender", budget_usd=BUDGET)
        assert [(await _ask(http, spender)).status_code for _ in range(2)] == [200, 200]
        spent_before = await _until_spent(admin, spender_id, 2 * COST)
        # One concurrency slot, held at the upstream through the kill.
        single, _ = await _make_key(admin, "single", concurrency=1)
        slow.set_default(Held())
        held = asyncio.create_task(_ask(http, single, "c", timeout=6 * WAIT))
        await slow.wait_for_requests(1, timeout=WAIT)
        # An RPM limit, partly used just before the kill.
        rate, rate_id = await _make_key(admin, "rate", rpm=RPM)
        seen = len(up.requests)
        assert [(await _ask(http, rate)).status_code for _ in range(BEFORE)] == [200] * BEFORE

        proc = hosts[victim].proc
        assert proc is not None
        proc.kill()
        await until_owned(kv, units, {survivor})

        # The survivor answers with what the killed host saved: keys, limits, counts.
        async def until_answered(key: str, model_id: str = "m") -> httpx.Response:
            deadline = time.monotonic() + WAIT
            while (resp := await _ask(http, key, model_id)).status_code == 503:
                assert time.monotonic() < deadline, resp.text  # the owner still starting
            return resp

        try:
            second: httpx.Response | None = await until_answered(single, "c")
        except httpx.ReadTimeout:
            second = None  # admitted: held at the upstream beside the first
        rated = [(await until_answered(rate)).status_code for _ in range(RPM)]
        spender_after = await _usage(admin, spender_id)
        over = await until_answered(spender)
        rate_limit = (await _usage(admin, rate_id))["limit"]
        slow.release_held()
        first = await asyncio.wait_for(held, WAIT)
    finally:
        slow.release_held()
        await admin.aclose()
        await http.aclose()
        await watcher.aclose()

    assert first.status_code == 200
    # The slot is still taken by the request that held it through the kill.
    assert second is not None and second.status_code == 429, second
    assert second.json()["error"]["code"] == "rate_limited"
    assert slow.max_in_flight == 1
    # The RPM counts the requests admitted before the kill: only the rest of it is admitted.
    assert rated == [200] * (RPM - BEFORE) + [429] * BEFORE, rated
    assert len(up.requests) - seen == RPM  # counted where it matters
    assert (rate_limit or {}).get("rpm") == RPM
    # The budget and what was spent of it are still there: one more request no longer fits.
    assert spent_before == pytest.approx(2 * COST)
    assert spender_after["limit"]["budget_usd"] == pytest.approx(BUDGET)
    assert spender_after["usage"]["spent_usd"] == pytest.approx(spent_before)
    assert over.json()["error"]["code"] == "budget_exceeded", over.text
