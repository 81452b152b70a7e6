"""A reload that replaces the limits' owner (its own settings changed: ``limits.
lease_ttl_seconds``) while a limited key's request runs: the new owner holds that request's
lease, so the key's concurrency limit still holds, and its settle replaces the reservation
it was admitted on. The old owner saved its counters but not its leases: the key's
``in_flight`` fell to 0 with the request still running, a second one was served past
``concurrency: 1``, and the first request's whole reservation stayed in ``tokens_last_minute``
after it settled. On ``inproc://`` and NATS."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.e2e.conftest import HI, model, route
from tests.e2e.keys_support import admin_http, keys_config
from tests.e2e.limits_support import new_key, set_limit
from tests.fixtures.upstream import Held

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e


async def _usage(gw: RunningGateway, key_id: str) -> dict[str, Any]:
    resp = await admin_http(gw).get(f"/admin/limits/key/{key_id}")
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["usage"])


async def test_a_reload_replacing_the_limits_owner_keeps_the_leases_of_requests_under_way(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    path = tmp_path / "gw.yaml"

    def declared(ttl: float) -> dict[str, Any]:
        limits = {"snapshot_seconds": 0.1, "lease_ttl_seconds": ttl}
        return keys_config(tmp_path, model("m", route(fake_upstream)), limits=limits)

    gw = await gateway_factory(declared(30), config_path=path)
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, concurrency=1, tpm=1_000_000)
    client = gw.http(headers={"authorization": f"Bearer {key}"})
    fake_upstream.enqueue(Held())
    big = {"model": "m", "messages": HI, "max_tokens": 10_000}
    first = asyncio.create_task(client.post("/v1/chat/completions", json=big))
    await fake_upstream.wait_for_requests(1)

    path.write_text(yaml.safe_dump(declared(20)))
    reloaded = await admin_http(gw).post("/admin/config/reload", json={})
    during = await _usage(gw, key_id)
    second = await client.post("/v1/chat/completions", json={"model": "m", "messages": HI})
    fake_upstream.release_held()
    served = await first
    after = await _usage(gw, key_id)

    assert reloaded.status_code == 200, reloaded.text
    assert during["in_flight"] == 1
    assert second.status_code == 429, second.text  # concurrency 1, the first still running
    assert served.status_code == 200, served.text
    used = served.json()["usage"]["total_tokens"]
    assert after["in_flight"] == 0
    assert after["tokens_last_minute"] == used  # its reservation replaced by what it used
