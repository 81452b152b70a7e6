"""``llmgw replay`` with a running gateway as its trace's source: the request log asked of
its owner, through an ingress's admin API (``--url``) or over NATS (``--bus``), with the
keys its callers presented, their roles and limits."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import pytest
import yaml

from gateway.cli.main import main
from tests.e2e.conftest import config, model, route
from tests.e2e.test_replay_openai_sdk import send

if TYPE_CHECKING:
    from pathlib import Path

    import httpx

    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = pytest.mark.e2e

_ADMIN = "adm-replay-e2e-key"
_WAIT_S = 10.0


async def _logged(http: httpx.AsyncClient, admin: dict[str, str], requests: int) -> None:
    """Return once the log's owner holds ``requests`` request rows (on NATS the rows reach it
    from the ingress while another connection, the CLI's, may already be asking)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _WAIT_S
    while True:
        resp = await http.post("/admin/log/query", json={"kind": "request"}, headers=admin)
        rows = resp.json()["rows"] if resp.status_code == 200 else []
        if len(rows) >= requests:
            return
        assert loop.time() < deadline, f"{len(rows)} of {requests} request rows logged"
        await asyncio.sleep(0.05)  # polling the owner's answer, bounded by _WAIT_S


async def test_llmgw_replay_asks_a_running_gateway_for_its_log_and_its_callers_keys(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
    bus_url: str,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    live = config(model("m", route(a), route(b)), admin_key=_ADMIN)
    gw = await gateway_factory(live)
    admin = {"authorization": f"Bearer {_ADMIN}"}
    http = gw.http()
    made = await http.post(
        "/admin/keys", json={"org": "acme", "user": "batch", "role": "pro"}, headers=admin
    )
    assert made.status_code == 201, made.text
    key_id, secret = made.json()["id"], made.json()["key"]
    limited = await http.put(f"/admin/limits/key/{key_id}", json={"rpm": 4}, headers=admin)
    assert limited.status_code == 200, limited.text
    assert await send(gw, 6, api_key=secret) == 4  # the key's rpm refuses two, live
    await _logged(http, admin, 6)
    (tmp_path / "live.yaml").write_text(yaml.safe_dump(live))
    steady = {"median": 0.01, "p90": 0.01}
    providers = {"providers": [{"base_url": u.openai_base_url, "ttft": steady} for u in (a, b)]}
    (tmp_path / "providers.yaml").write_text(yaml.safe_dump(providers))
    argv = ["--log-level", "error", "replay", "--since", "10m"]
    argv += ["--providers", str(tmp_path / "providers.yaml")]
    argv += ["--config", str(tmp_path / "live.yaml")]
    if bus_url.startswith("nats://"):
        argv += ["--bus", bus_url]
    else:
        argv += ["--url", gw.url]
        refused = await asyncio.to_thread(main, [*argv, "--admin-key", "wrong", "--out", "-"])
        assert refused == 1  # the admin API refuses the key: nothing is replayed
        argv += ["--admin-key", _ADMIN]

    out = tmp_path / "report"
    assert await asyncio.to_thread(main, [*argv, "--out", str(out)]) == 0
    summary = json.loads((out / "report.json").read_text())["configs"]["live"]
    # The same caller with the same key and limit: the same two refused.
    assert (summary["requests"], summary["served"], summary["errors"]) == (6, 4, {"429": 2})
