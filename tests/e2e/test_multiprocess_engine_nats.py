"""The routing engine scaled out on NATS: one ``--role actors`` process and two ``--role
ingress`` processes. The half-open probe is one lease for the whole deployment, and an
affinity pin and an admin weight change made through one ingress hold through the other:
the state lives in the actors process, not in either ingress."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import yaml

from bus import open_bus
from schemas import subjects
from tests.e2e.conftest import (
    CHAT,
    WAIT,
    Watch,
    assert_openai_error,
    chat,
    config,
    eid,
    model,
    route,
)
from tests.fixtures.gateway import GatewayProcess
from tests.fixtures.upstream import FakeUpstream, Hang, Reply, UpstreamFactory

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

pytestmark = [pytest.mark.e2e, pytest.mark.nats]

ADMIN = "adm-multiprocess"


@pytest.fixture
async def deployment(nats_url: str, tmp_path: Path) -> AsyncIterator[Any]:
    """``await start(config)`` -> (ingress one, ingress two) after an actors process, all on
    ``nats_url`` with a database in ``tmp_path``; every process is stopped afterwards."""
    started: list[GatewayProcess] = []

    async def spawn(*args: str) -> GatewayProcess:
        proc = GatewayProcess(["serve", *args])
        started.append(proc)
        return await asyncio.to_thread(proc.start)

    async def start(cfg: dict[str, Any]) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
        path = tmp_path / "gw.yaml"
        path.write_text(yaml.safe_dump({**cfg, "database": {"path": str(tmp_path / "db")}}))
        common = ["--config", str(path), "--bus", nats_url]
        await spawn(*common, "--role", "actors")
        one, two = await asyncio.gather(
            spawn(*common, "--role", "ingress", "--port", "0"),
            spawn(*common, "--role", "ingress", "--port", "0"),
        )
        return (
            httpx.AsyncClient(base_url=one.url, timeout=WAIT),
            httpx.AsyncClient(base_url=two.url, timeout=WAIT),
        )

    yield start
    for proc in reversed(started):
        await asyncio.to_thread(proc.stop)


async def test_half_open_admits_one_probe_across_both_ingresses_and_recovers_through_either(
    nats_url: str,
    deployment: Any,
    fake_upstream: FakeUpstream,
) -> None:
    up = fake_upstream
    # The probe's deadline is the route's timeout: ample for the burst to be refused inside it.
    one, two = await deployment(
        config(model("m", route(up)), circuit={"failure_threshold": 1, "cooldown_seconds": 1.5})
    )
    up.enqueue(Reply(500), Hang())
    watcher = await open_bus(nats_url, name="test-watcher")
    try:
        async with watcher.subscribe(subjects.event("circuit")) as sub, one, two:
            events = Watch(sub)
            assert (await one.post(CHAT, json=chat("m"))).status_code == 502
            await events.circuit("open", eid("m", up))
            await events.circuit("half_open", eid("m", up))

            burst = [asyncio.create_task(via.post(CHAT, json=chat("m"))) for via in (one, two) * 4]
            refused = []
            for fut in asyncio.as_completed(burst, timeout=WAIT):
                refused.append(await fut)
                if len(refused) == 7:
                    break
            await up.wait_for_requests(2)  # the probe may still be on its way under load
            admitted = len(up.requests)
            next(t for t in burst if not t.done()).cancel()  # the probe's client leaves
            reopened = await events.circuit("open", eid("m", up))
            await events.circuit("half_open", eid("m", up))
            served = await two.post(CHAT, json=chat("m"))
            await events.circuit("closed", eid("m", up))
            after = await one.post(CHAT, json=chat("m"))
    finally:
        await watcher.aclose()

    for resp in refused:
        assert_openai_error(resp, 503, "all_circuits_open")
    assert admitted == 2  # the failure that opened the circuit, and the single probe
    assert "abandoned" in reopened.reason
    assert served.status_code == 200 and after.status_code == 200
    assert len(up.requests) == 4


async def test_pin_and_weights_set_through_one_ingress_hold_through_the_other(
    deployment: Any,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    one, two = await deployment(
        config(
            model("m", route(a, 1), route(b, 1e-9)),
            admin_key=ADMIN,
            routing={"trust_proxy_headers": True},
        )
    )
    auth = {"authorization": f"Bearer {ADMIN}"}

    async def via(client: httpx.AsyncClient, ip: str) -> str:
        resp = await client.post(CHAT, json=chat("m"), headers={"x-forwarded-for": ip})
        assert resp.status_code == 200, resp.text
        return str(resp.headers["x-routed-via"])

    async with one, two:
        pinned = await via(one, "10.0.0.1")
        for up, weight in ((b, 1), (a, 1e-9)):  # through two: fresh picks now go to b
            put = await two.put(
                f"/admin/routing/weights/m/{eid('m', up)}", json={"weight": weight}, headers=auth
            )
            assert put.status_code == 200, put.text
        seen_by_one = (await one.get("/routing")).json()["models"]["m"]["routes"]
        still = [await via(two, "10.0.0.1"), await via(one, "10.0.0.1")]
        newcomer = [await via(one, "10.0.0.2"), await via(two, "10.0.0.2")]

    assert pinned == eid("m", a)
    assert [r["endpoint"] for r in seen_by_one] == [eid("m", a), eid("m", b)]
    assert [r["weight"] for r in seen_by_one] == pytest.approx([0, 1], abs=1e-6)
    assert still == [eid("m", a)] * 2
    assert newcomer == [eid("m", b)] * 2
