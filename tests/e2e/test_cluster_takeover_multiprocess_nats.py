"""Two ``--role actors`` hosts and one ingress on a three-node NATS cluster (JetStream, R3):
the actors are split between the hosts, a host killed with SIGKILL has its share taken over
from JetStream within seconds (a weight override set before the kill survives), and the
host restarted takes its share back with never two owners of a unit: a concurrency limit of
1 held across the handback is never exceeded at the upstream. A host whose NATS node stops
answering (SIGSTOP: the process lives on, cut off) stops its own share at its lease deadline
and the other host takes it over. The hosts share the request log in PostgreSQL (a second
host with it in SQLite is refused)."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import TYPE_CHECKING

import openai
import pytest

from actors import build_tree
from actors.cluster import OWNERS_BUCKET
from bus import BusClosedError, open_bus
from gateway.process.config import load_config
from tests.e2e.cluster_support import (
    owners_of,
    pair_moving_together,
    spawn_serve,
    until_owned,
    write_config,
)
from tests.e2e.conftest import PROCESS_WAIT, WAIT, config, eid, model, route
from tests.fixtures.upstream import Held

if TYPE_CHECKING:
    from pathlib import Path

    from openai.types.chat import ChatCompletionMessageParam

    from bus import KeyValue
    from tests.fixtures.gateway import GatewayProcess
    from tests.fixtures.nats import NatsCluster
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = [pytest.mark.e2e, pytest.mark.nats]

ADMIN = "cluster-admin-key"
CLUSTER = {"enabled": True, "heartbeat_seconds": 0.5, "ttl_seconds": 1.5, "replicas": 3}
SERVED_AFTER_S = 5.0  # every request sent this long after the kill must be answered
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


# Three processes started, one killed and started again: on a loaded machine (CI runs four
# workers on two cores) its bounded waits may add up past the default 60 s, and each of them
# fails with what it waited for before this one does.
@pytest.mark.timeout(120)
async def test_a_killed_actors_host_is_taken_over_from_jetstream_and_handed_back(
    nats_cluster: NatsCluster,
    postgres_url: str,
    tmp_path: Path,
    fake_upstreams: UpstreamFactory,
    processes: list[GatewayProcess],
) -> None:
    one, two = await fake_upstreams("one"), await fake_upstreams("two")
    slot = route(one, provider_type="concurrency", concurrency={"limit": 1})
    base = config(
        model("m", slot, route(two, fallback_only=True)), admin_key=ADMIN, cluster=CLUSTER
    )
    nodes = pair_moving_together("models", "capacity")
    cfgs = {
        node: write_config(
            tmp_path / f"{node}.yaml",
            {**base, "database": {"path": str(tmp_path / node), "url": postgres_url}},
        )
        for node in nodes
    }
    units = {s.name for s in build_tree(load_config(cfgs[nodes[0]]), request_log=True).specs}
    nats_cluster_urls = nats_cluster.urls
    bus_url = ",".join(nats_cluster_urls)
    hosts = {
        node: await spawn_serve(
            processes, "--config", path, "--bus", bus_url, "--role", "actors", "--node-id", node
        )
        for node, path in cfgs.items()
    }
    ingress = await spawn_serve(
        processes,
        "--config",
        cfgs[nodes[0]],
        "--bus",
        bus_url,
        "--role",
        "ingress",
        "--port",
        "0",
    )
    watcher = await open_bus(nats_cluster_urls[1], name="test-watcher")
    client = openai.AsyncOpenAI(base_url=f"{ingress.url}/v1", api_key="sk-x", max_retries=0)
    admin = {"authorization": f"Bearer {ADMIN}"}
    try:
        kv = await watcher.key_value(OWNERS_BUCKET, replicas=3)
        split = await until_owned(kv, units, set(nodes))
        # The host of the ModelActors (whose overrides must survive) and of the capacity pool.
        victim = split["models"]
        survivor = nodes[1] if victim == nodes[0] else nodes[0]
        set_weight = await client._client.post(
            f"{ingress.url}/admin/routing/set_weight",
            json={"model": "m", "endpoint": eid("m", one), "weight": 4},
            headers=admin,
            timeout=WAIT,
        )
        assert set_weight.status_code == 200, set_weight.text

        proc = hosts[victim].proc
        assert proc is not None
        proc.kill()
        killed = time.monotonic()
        outcomes: list[tuple[float, int, str, str | None]] = []
        while (sent := time.monotonic() - killed) < SERVED_AFTER_S + 1.0:
            try:
                raw = await client.chat.completions.with_raw_response.create(
                    model="m", messages=HI, timeout=WAIT
                )
                outcomes.append((sent, raw.http_response.status_code, "", None))
            except openai.APIStatusError as exc:
                resp = exc.response
                outcomes.append(
                    (sent, resp.status_code, resp.text, resp.headers.get("retry-after"))
                )
            await asyncio.sleep(0.1)  # the pace of the clients, not a wait for an outcome
        taken = await until_owned(kv, units, {survivor})
        weights = await client._client.get(
            f"{ingress.url}/admin/routing/weights",
            params={"model": "m"},
            headers=admin,
            timeout=WAIT,
        )

        # The one slot is held through the handback of its pool: no second request may
        # reach the upstream, whichever owner answers.
        one.set_default(Held())
        seen = len(one.requests)
        # Held across the restart and the handback below, each bounded on its own.
        held_for = PROCESS_WAIT + 3 * WAIT
        held = asyncio.create_task(
            client.chat.completions.create(model="m", messages=HI, timeout=held_for)
        )
        await one.wait_for_requests(seen + 1, timeout=WAIT)
        handing_back = asyncio.create_task(
            spawn_serve(
                processes,
                "--config",
                cfgs[victim],
                "--bus",
                bus_url,
                "--role",
                "actors",
                "--node-id",
                victim,
            )
        )
        during = await _requests_until_handed_back(client, kv, handing_back, split)
        hosts[victim] = await handing_back
        back = await owners_of(kv)
        after = await client.chat.completions.create(model="m", messages=HI, timeout=WAIT)
        one.release_held()
        first = await asyncio.wait_for(held, WAIT)
    finally:
        await client.close()
        await watcher.aclose()

    assert set(taken.values()) == {survivor}
    assert back == split  # the same placement, so the restarted host's share came back
    assert after.choices and first.choices and 200 in during
    assert one.max_in_flight == 1  # one owner of the pool at a time, its lease carried over
    late = [o for o in outcomes if o[0] >= SERVED_AFTER_S]
    assert late and all(status == 200 for _, status, _, _ in late), late
    for _, status, text, retry_after in outcomes:
        if status != 200:
            assert status == 503 and retry_after is not None, (status, text)
            assert "llmgw." not in text  # no bus subject in what the client sees
    routes = {r["endpoint"]: r["weight"] for r in weights.json()["models"][0]["routes"]}
    assert routes[eid("m", one)] == 4.0  # the override outlived its owner, from JetStream


async def _requests_until_handed_back(
    client: openai.AsyncOpenAI,
    kv: KeyValue,
    handing_back: asyncio.Task[GatewayProcess],
    split: dict[str, str],
) -> list[int]:
    """Send requests (a 200 or a 503 with Retry-After each) until the restarted host is up
    and the owners are ``split`` again; 0 for a request held at the busy upstream (a second
    slot was granted), which ends the loop. Raises AssertionError, with the owners last seen,
    when the handback has not settled ``WAIT`` after the host could have been ready."""
    during: list[int] = []
    owners: dict[str, str] = {}
    try:
        async with asyncio.timeout(PROCESS_WAIT + WAIT):
            while not handing_back.done() or (owners := await owners_of(kv)) != split:
                try:
                    raw = await client.chat.completions.with_raw_response.create(
                        model="m", messages=HI, timeout=WAIT / 2
                    )
                    during.append(raw.http_response.status_code)
                except openai.APIStatusError as exc:
                    assert exc.status_code == 503 and "retry-after" in exc.response.headers
                    during.append(exc.status_code)
                except openai.APITimeoutError:
                    during.append(0)  # held at the busy upstream: a second slot was granted
                    break
                await asyncio.sleep(0.1)  # the pace of the clients, not a wait for an outcome
    except TimeoutError:
        raise AssertionError(
            f"the handback did not settle on {split}: owners {owners}, answers {during}"
        ) from None
    return during


async def test_an_actors_host_cut_off_from_nats_stops_its_share_before_the_other_takes_it(
    nats_cluster: NatsCluster,
    postgres_url: str,
    tmp_path: Path,
    fake_upstreams: UpstreamFactory,
    processes: list[GatewayProcess],
) -> None:
    up = await fake_upstreams("up")
    base = config(model("m", route(up)), cluster=CLUSTER)
    cfgs = {
        node: write_config(
            tmp_path / f"{node}.yaml",
            {**base, "database": {"path": str(tmp_path / node), "url": postgres_url}},
        )
        for node in ("a", "b")
    }
    units = {s.name for s in build_tree(load_config(cfgs["a"]), request_log=True).specs}
    urls, frozen = nats_cluster.urls, nats_cluster.procs[2]
    # a reaches the cluster only through the third node; b through the other two.
    buses = {"a": urls[2], "b": ",".join(urls[:2])}
    cut = await spawn_serve(
        processes,
        "--config",
        cfgs["a"],
        "--bus",
        buses["a"],
        "--role",
        "actors",
        "--node-id",
        "a",
    )
    await spawn_serve(
        processes,
        "--config",
        cfgs["b"],
        "--bus",
        buses["b"],
        "--role",
        "actors",
        "--node-id",
        "b",
    )
    watcher = await open_bus(urls[0], name="test-watcher")
    try:
        kv = await watcher.key_value(OWNERS_BUCKET, replicas=3)
        await until_owned(kv, units, {"a", "b"})
        frozen.send_signal(signal.SIGSTOP)  # a's process lives on; its NATS answers nothing
        try:
            taken = await until_owned(kv, units, {"b"})
            log = await asyncio.to_thread(cut.stop)
        finally:
            frozen.send_signal(signal.SIGCONT)
        await _until_serving(urls[2])  # the node is back for the tests after this one
    finally:
        await watcher.aclose()

    assert set(taken.values()) == {"b"}
    # It stopped its share itself once its beats went unanswered up to its lease deadline.
    assert "heartbeat lapsed" in log and "stopping every unit" in log


async def _until_serving(url: str) -> None:
    """Return once JetStream answers a key-value read through the node at ``url``."""
    bus = await open_bus(url, name="test-node-check")
    try:
        # A node resumed after SIGSTOP catches its JetStream up before it answers: under a
        # loaded suite (CI runs four workers) that took over 20 s once.
        async with asyncio.timeout(WAIT * 6):
            while True:
                try:
                    await (await bus.key_value(OWNERS_BUCKET, replicas=3)).get("models")
                    return
                except BusClosedError:
                    await asyncio.sleep(0.2)  # the node is catching up: poll the outcome
    finally:
        await bus.aclose()
