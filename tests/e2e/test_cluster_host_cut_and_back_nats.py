"""An actors host whose NATS connection drops, its process and its server alive, for longer
than the other host needs to take it for dead, then comes back (a relay between it and its
node cut, then restored), with the default heartbeat and TTL on a three-node NATS cluster:

- the other host takes its share over (it removed the membership of the host no process
  answered for, long before the key's TTL);
- the host back answers for none of it: past its serving lease it holds its units' messages
  (for a while its beats get no answer: the relay holds what its server sends its inboxes)
  and, its membership found removed, stops its units and joins again (break before make),
  then takes its share back;
- never two owners: a concurrency limit of 1, its one slot held at the upstream from the
  takeover on, is never exceeded (a second grant of it, by whichever owner, would show)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import openai
import pytest

from actors import build_tree
from actors.cluster import OWNERS_BUCKET, owner_of
from bus import open_bus
from gateway.process.config import load_config
from tests.e2e.cluster_support import (
    Relay,
    owners_of,
    pair_moving_together,
    spawn_serve,
    until_owned,
    write_config,
)
from tests.e2e.conftest import WAIT, config, model, route
from tests.fixtures.nats import start_nats_cluster
from tests.fixtures.upstream import Held

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

    from openai.types.chat import ChatCompletionMessageParam

    from bus import KeyValue
    from tests.fixtures.gateway import GatewayProcess
    from tests.fixtures.nats import NatsCluster
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = [pytest.mark.e2e, pytest.mark.nats]

CLUSTER = {"enabled": True, "replicas": 3}  # the defaults: beats every 1 s, a 12 s TTL
RATE = 10  # requests a second while the host is cut off and back
HOLD_S = 2.0  # the answers to the host back are held this long (its lease deadline is 11 s)
HELD_FOR = 120.0  # a request's timeout: none gives up on its held slot during the test
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """A three-node NATS cluster that tells its clients of no server but the one they were
    given (so the cut-off host can only come back through the relay); requested before
    ``processes`` so the processes stop before it does."""
    with start_nats_cluster(tmp_path / "natsc", advertise=False) as cluster:
        yield cluster


@pytest.fixture
async def relay(own_cluster: NatsCluster) -> AsyncIterator[Relay]:
    r = Relay(own_cluster.urls[2])
    await r.start()
    yield r
    await r.cut()


async def _load(client: openai.AsyncOpenAI, sent: list[asyncio.Task[int]]) -> None:
    """Open-loop requests at ``RATE`` until cancelled; each task ends with its status."""

    async def one() -> int:
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model="m", messages=HI, timeout=HELD_FOR
            )
        except openai.APIStatusError as exc:
            assert exc.status_code == 503 and "retry-after" in exc.response.headers, exc
            assert "llmgw." not in exc.response.text  # no bus subject in what the client sees
            return exc.status_code
        return raw.http_response.status_code

    while True:
        sent.append(asyncio.create_task(one()))
        await asyncio.sleep(1 / RATE)  # the load's pace, not a wait for an outcome


async def _until(kv: KeyValue, owners: dict[str, str]) -> dict[str, str]:
    """``owners`` once they are the units' owners; AssertionError after ``2 * WAIT``."""
    seen: dict[str, str] = {}
    try:
        async with asyncio.timeout(2 * WAIT):
            while True:
                if (seen := await owners_of(kv)) == owners:
                    break
                await asyncio.sleep(0.1)  # the owners are in JetStream: poll the outcome
    except TimeoutError:
        raise AssertionError(f"owners {seen}, not {owners}") from None
    return seen


@pytest.mark.timeout(150)
async def test_a_host_cut_off_and_back_answers_for_nothing_the_other_took_over(
    own_cluster: NatsCluster,
    relay: Relay,
    postgres_url: str,
    tmp_path: Path,
    fake_upstreams: UpstreamFactory,
    processes: list[GatewayProcess],
) -> None:
    one, two = await fake_upstreams("one"), await fake_upstreams("two")
    slot = route(one, provider_type="concurrency", concurrency={"limit": 1})
    base = config(model("m", slot, route(two, fallback_only=True)), cluster=CLUSTER)
    nodes = pair_moving_together("models", "capacity")
    cut_off = owner_of("models", nodes)  # and of the capacity pool
    other = nodes[1] if cut_off == nodes[0] else nodes[0]
    urls = own_cluster.urls
    buses = {cut_off: relay.url, other: ",".join(urls[:2])}
    cfgs = {
        node: write_config(
            tmp_path / f"{node}.yaml",
            {**base, "database": {"path": str(tmp_path / node), "url": postgres_url}},
        )
        for node in nodes
    }
    units = {s.name for s in build_tree(load_config(cfgs[other]), request_log=True).specs}
    hosts = {
        node: await spawn_serve(
            processes, "--config", cfgs[node], "--bus", buses[node], "--role", "actors",
            "--node-id", node,
        )
        for node in nodes
    }  # fmt: skip
    ingress = await spawn_serve(
        processes, "--config", cfgs[other], "--bus", buses[other], "--role", "ingress",
        "--port", "0",
    )  # fmt: skip
    watcher = await open_bus(urls[0], name="test-watcher")
    client = openai.AsyncOpenAI(base_url=f"{ingress.url}/v1", api_key="x", max_retries=0)
    sent: list[asyncio.Task[int]] = []
    try:
        kv = await watcher.key_value(OWNERS_BUCKET, replicas=3)
        split = await until_owned(kv, units, set(nodes))
        one.set_default(Held())  # the slot, once granted, stays taken until the end
        await relay.cut()
        loading = asyncio.create_task(_load(client, sent))
        try:
            await until_owned(kv, units, {other})  # taken over meanwhile
            # The host reconnects at its next attempt (1 s apart), its subscribers served at
            # once but the answers to its own requests (its beat's) held a while: the window
            # in which its stale units, were they answering, would grant the slot again.
            relay.hold_replies()
            await relay.start()
            await asyncio.sleep(HOLD_S)  # the load runs on through the window
            relay.release_replies()
            back = await _until(kv, split)
            await asyncio.sleep(1.0)  # a second more of load under the owners back
        finally:
            loading.cancel()
        one.release_held()
        statuses = await asyncio.wait_for(asyncio.gather(*sent), WAIT)
    finally:
        await client.close()
        await watcher.aclose()
    logs = {}
    for node, host in hosts.items():
        processes.remove(host)
        logs[node] = await asyncio.to_thread(host.stop)

    assert back == split  # the host back took its share back
    assert one.max_in_flight == 1  # one owner of the pool at a time
    assert 200 in statuses and set(statuses) <= {200, 503}
    assert "no process answers for it" in logs[other]  # removed, not lapsed
    # Back, it fenced its units: what reached them waited, unanswered, then was dropped.
    assert "past this host's serving lease" in logs[cut_off]
    assert "our membership is gone" in logs[cut_off]
    assert "heartbeat lapsed" not in logs[cut_off]  # back before its lease deadline
