"""``cluster members`` through the real processes on NATS: two ``--role actors`` hosts and
an ingress; the command, over the ingress's HTTP admin API and as ``llmgw admin cluster
members --bus``, lists both hosts (role, since, last heartbeat) and the units each owns, as
the owners bucket in JetStream records them."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import yaml

from actors import build_tree
from actors.cluster import OWNERS_BUCKET, Owners
from bus import open_bus
from gateway.process.config import load_config
from tests.e2e.cluster_support import spawn_actors, spawn_ingress
from tests.e2e.conftest import PROCESS_WAIT, WAIT, config, model, route
from tests.fixtures.gateway import REPO, GatewayProcess

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, pytest.mark.nats]

ADMIN = "members-admin-key"
CLUSTER = {"enabled": True, "heartbeat_seconds": 0.5, "ttl_seconds": 1.5}
NODES = ("n1", "n2")


async def _settled(http: httpx.AsyncClient, units: set[str]) -> dict[str, Any]:
    """The members answer once both hosts are members, each owns units and none is unowned."""
    answer: dict[str, Any] = {}
    try:
        async with asyncio.timeout(WAIT * 2):
            while True:
                resp = await http.get("/admin/cluster/members")
                if resp.status_code == 200:
                    answer = resp.json()
                    members = answer["members"]
                    owned = {u for m in members for u in m["units"]}
                    if len(members) == len(NODES) and all(m["units"] for m in members):
                        if owned == units and not answer["unowned"]:
                            return answer
                await asyncio.sleep(0.1)  # placement runs on the hosts' beats: poll it
    except TimeoutError:
        raise AssertionError(f"the cluster did not settle in {WAIT * 2} s: {answer}") from None


async def test_cluster_members_lists_each_actors_host_and_its_units_over_http_and_the_cli(
    own_nats: str,
    postgres_url: str,
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    processes: list[GatewayProcess],
) -> None:
    base = config(model("m", route(fake_upstream)), admin_key=ADMIN, cluster=CLUSTER)
    paths = {}
    for node in NODES:
        paths[node] = tmp_path / f"{node}.yaml"
        body = {**base, "database": {"path": str(tmp_path / node), "url": postgres_url}}
        paths[node].write_text(yaml.safe_dump(body))
    units = {s.name for s in build_tree(load_config(str(paths["n1"])), request_log=True).specs}
    started = time.time()
    for node in NODES:
        await spawn_actors(processes, paths[node], own_nats, node)
    ingress = await spawn_ingress(processes, paths["n1"], own_nats)
    headers = {"authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(base_url=ingress.url, headers=headers, timeout=WAIT) as http:
        answer = await _settled(http, units)
        anonymous = await http.get("/admin/cluster/members", headers={"authorization": ""})
    cli = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli.main", "admin", "cluster", "members",
        "--bus", own_nats, "--timeout", str(WAIT),
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(PROCESS_WAIT):
        out, err = await cli.communicate()
    watcher = await open_bus(own_nats, name="test-watcher")
    try:
        recorded = await Owners(await watcher.key_value(OWNERS_BUCKET)).all()
    finally:
        await watcher.aclose()

    assert [m["node_id"] for m in answer["members"]] == list(NODES)
    for member in answer["members"]:
        assert member["role"] == "actors"
        assert started <= member["since"] <= member["last_heartbeat"] <= time.time()
        assert set(member["units"]) == {u for u, n in recorded.items() if n == member["node_id"]}
    assert answer["answered_by"] in NODES
    assert anonymous.status_code == 401, anonymous.text
    assert cli.returncode == 0, err.decode()
    by_cli = json.loads(out)
    assert {m["node_id"]: m["units"] for m in by_cli["members"]} == {
        m["node_id"]: m["units"] for m in answer["members"]
    }
    assert by_cli["unowned"] == []
