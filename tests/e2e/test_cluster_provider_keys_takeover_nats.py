"""Provider keys added through the admin API, and reservations, outlive a killed owner.

Two ``--role actors`` hosts and one ingress on a three-node NATS cluster; each host has its
own SQLite file and both share PostgreSQL (``database.url``). A provider key is added to the
route and the route's configured key is reserved for ``pro``, so a ``free`` caller is served
with the added key; then the host owning the ``keys`` unit is killed (kill -9). After the
takeover the survivor, which never saw the admin command, serves the free caller with the
added key still (a host reading its own file would know neither the key nor the
reservation, and would send the configured key), and lists both.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from actors.cluster import OWNERS_BUCKET, owner_of
from actors.stores.provider_keys import PROVIDER_KEYS, LazyDb, ProviderKeyStore
from bus import open_bus
from schemas.config import credential_id
from tests.e2e.cluster_support import deploy, until_owned
from tests.e2e.conftest import CHAT, HI, WAIT, config, eid, model, route
from tests.e2e.test_cluster_takeover_multiprocess_nats import CLUSTER

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayProcess
    from tests.fixtures.nats import NatsCluster
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, pytest.mark.nats]

ADMIN = "provider-keys-admin-key"
UP_KEY, DB_KEY = "sk-configured-upstream-key", "sk-added-through-the-admin-api"
NODES = ("pk-a", "pk-b")


async def _served_with(http: httpx.AsyncClient, key: str, up: FakeUpstream) -> str | None:
    """The credential the upstream saw for one request of ``key``, retrying the 503s of a
    takeover under way (bounded by ``WAIT``)."""
    deadline = time.monotonic() + WAIT
    while True:
        resp = await http.post(
            CHAT,
            json={"model": "m", "messages": HI, "max_tokens": 5},
            headers={"authorization": f"Bearer {key}"},
        )
        if resp.status_code != 503:
            break
        assert time.monotonic() < deadline, resp.text  # the keys' new owner still starting
        await asyncio.sleep(0.05)  # the owner's start has no event an ingress can await
    assert resp.status_code == 200, resp.text
    return up.requests[-1].credential


@pytest.mark.timeout(120)
async def test_provider_keys_and_reservations_outlive_a_killed_owner(
    nats_cluster: NatsCluster,
    postgres_url: str,
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    processes: list[GatewayProcess],
) -> None:
    base = config(
        model("m", route(fake_upstream, api_keys=[UP_KEY])), admin_key=ADMIN, cluster=CLUSTER
    )
    dep = await deploy(processes, tmp_path, base, NODES, nats_cluster.urls, postgres_url)
    units, hosts, ingress = dep.units, dep.hosts, dep.ingress
    watcher = await open_bus(nats_cluster.urls[1], name="test-watcher")
    admin = httpx.AsyncClient(
        base_url=ingress.url, timeout=WAIT, headers={"authorization": f"Bearer {ADMIN}"}
    )
    http = httpx.AsyncClient(base_url=ingress.url, timeout=WAIT)
    try:
        kv = await watcher.key_value(OWNERS_BUCKET, replicas=3)
        victim = (await until_owned(kv, units, set(NODES)))["keys"]
        (survivor,) = set(NODES) - {victim}
        made = await admin.post("/admin/keys", json={"org": "acme", "user": "u", "role": "free"})
        assert made.status_code == 201, made.text
        caller = made.json()["key"]
        added = await admin.post(
            "/admin/provider-keys", json={"key": DB_KEY, "endpoint": eid("m", fake_upstream)}
        )
        assert added.status_code == 201, added.text
        reserved = await admin.post(
            "/admin/provider-keys/min-role-env", json={"key": UP_KEY, "min_role": "pro"}
        )
        assert reserved.status_code == 200, reserved.text
        before = await _served_with(http, caller, fake_upstream)

        proc = hosts[victim].proc
        assert proc is not None
        proc.kill()
        await until_owned(kv, units, {survivor})
        after = await _served_with(http, caller, fake_upstream)
        listed = await admin.get("/admin/provider-keys")
    finally:
        await admin.aclose()
        await http.aclose()
        await watcher.aclose()

    assert before == DB_KEY
    assert after == DB_KEY  # the survivor knows the key, its secret and the reservation
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert [k["id"] for k in body["database"]] == [added.json()["id"]]
    assert [(r["credential_id"], r["min_role"]) for r in body["reservations"]] == [
        (credential_id(UP_KEY), "pro")
    ]


@pytest.mark.timeout(120)
async def test_a_host_joining_a_cluster_moves_the_keys_of_its_own_file_into_postgres(
    nats_cluster: NatsCluster,
    postgres_url: str,
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    processes: list[GatewayProcess],
) -> None:
    # The second host ran alone before: its SQLite file holds a provider key added through the
    # admin API and a reservation of the configured key. The first host starts first and keeps
    # the keys unit once both run, so it must re-read them when the second has moved them.
    keeper = owner_of("keys", NODES)
    nodes = (keeper, *(n for n in NODES if n != keeper))
    legacy = ProviderKeyStore(LazyDb(str(tmp_path / nodes[1]), [PROVIDER_KEYS]))
    added = await legacy.add(
        DB_KEY, endpoint=eid("m", fake_upstream), base_url="", min_role="free", now=1.0
    )
    await legacy.reserve(credential_id(UP_KEY), "pro", 1.0)
    await legacy.aclose()
    base = config(
        model("m", route(fake_upstream, api_keys=[UP_KEY])), admin_key=ADMIN, cluster=CLUSTER
    )
    dep = await deploy(processes, tmp_path, base, nodes, nats_cluster.urls, postgres_url)
    watcher = await open_bus(nats_cluster.urls[1], name="test-watcher")
    admin = httpx.AsyncClient(
        base_url=dep.ingress.url, timeout=WAIT, headers={"authorization": f"Bearer {ADMIN}"}
    )
    http = httpx.AsyncClient(base_url=dep.ingress.url, timeout=WAIT)
    try:
        kv = await watcher.key_value(OWNERS_BUCKET, replicas=3)
        await until_owned(kv, dep.units, set(NODES))
        made = await admin.post("/admin/keys", json={"org": "acme", "user": "u", "role": "free"})
        assert made.status_code == 201, made.text
        served = await _served_with(http, made.json()["key"], fake_upstream)
        listed = await admin.get("/admin/provider-keys")
    finally:
        await admin.aclose()
        await http.aclose()
        await watcher.aclose()

    assert served == DB_KEY  # the moved key, and the moved reservation keeps UP_KEY from free
    assert listed.status_code == 200, listed.text
    assert [k["id"] for k in listed.json()["database"]] == [added.key_id]
    left = ProviderKeyStore(LazyDb(str(tmp_path / nodes[1]), [PROVIDER_KEYS]))
    assert await left.declarations() == ((), {})
    await left.aclose()
