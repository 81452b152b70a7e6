"""A config reload reaches every actors host of a cluster, not only the one asked.

Two ``--role actors`` hosts and an ingress on NATS, with node ids under which the ``models``
and ``health`` units are placed on different hosts. Every process's file gains a model and
one ``POST /admin/config/reload`` is sent: whichever host answers it, the other follows its
``ConfigChanged``, so the new model is served (its ModelActor runs on one host) and
``/health/deep`` lists its endpoint (the HealthActor runs on the other).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest

from actors import build_tree
from actors.cluster import OWNERS_BUCKET, owner_of
from bus import open_bus
from gateway.process.config import load_config
from gateway.process.control import config_version
from schemas import ChainModelsDropped, subjects
from tests.e2e.cluster_support import spawn_actors, spawn_ingress, until_owned, write_config
from tests.e2e.conftest import CHAT, HI, WAIT, config, eid, model, route

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
    from pathlib import Path

    from bus import Bus
    from tests.fixtures.gateway import GatewayProcess
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = [pytest.mark.e2e, pytest.mark.nats]

ADMIN = "reload-admin-key"
CLUSTER = {"enabled": True, "heartbeat_seconds": 0.5, "ttl_seconds": 1.5}


def _pair_splitting(a: str, b: str) -> tuple[str, str]:
    """Two node ids under which units ``a`` and ``b`` are placed on different hosts."""
    for n in range(1, 50):
        pair = ("r1", f"r{n + 1}")
        if owner_of(a, pair) != owner_of(b, pair):
            return pair
    raise AssertionError("no such pair")


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Return once ``check()`` holds. Raises AssertionError naming ``what`` after ``WAIT``."""
    deadline = time.monotonic() + WAIT
    while not await check():
        assert time.monotonic() < deadline, f"{what} not seen in {WAIT} s"
        await asyncio.sleep(0.05)  # a host follows the reload on its own: poll its effect


@asynccontextmanager
async def _cluster(
    processes: list[GatewayProcess], own_nats: str, paths: dict[str, Path], nodes: Iterable[str]
) -> AsyncIterator[tuple[Bus, httpx.AsyncClient]]:
    """An actors host per node of ``nodes`` and an ingress (``paths[node]``,
    ``paths["ingress"]``) on ``own_nats``: a watcher on the bus and an admin HTTP client of
    the ingress, closed on the way out."""
    for node in nodes:
        await spawn_actors(processes, paths[node], own_nats, node)
    ingress = await spawn_ingress(processes, paths["ingress"], own_nats)
    watcher = await open_bus(own_nats, name="test-watcher")
    headers = {"authorization": f"Bearer {ADMIN}"}
    http = httpx.AsyncClient(base_url=ingress.url, timeout=WAIT, headers=headers)
    try:
        yield watcher, http
    finally:
        await http.aclose()
        await watcher.aclose()


@pytest.mark.timeout(120)
async def test_a_reload_asked_of_one_host_reaches_the_units_of_every_host(
    own_nats: str,
    postgres_url: str,
    tmp_path: Path,
    fake_upstreams: UpstreamFactory,
    processes: list[GatewayProcess],
) -> None:
    up, added = await fake_upstreams("up"), await fake_upstreams("added")
    nodes = _pair_splitting("models", "health")

    def body(*models: dict[str, Any]) -> dict[str, Any]:
        base = config(*models, admin_key=ADMIN, cluster=CLUSTER)
        return {**base, "database": {"path": str(tmp_path / "db"), "url": postgres_url}}

    paths = {node: tmp_path / f"{node}.yaml" for node in (*nodes, "ingress")}
    for node, path in paths.items():
        body_of = body(model("m", route(up)))
        body_of["database"]["path"] = str(tmp_path / node)
        write_config(path, body_of)
    units = {s.name for s in build_tree(load_config(str(paths[nodes[0]])), request_log=True).specs}
    async with _cluster(processes, own_nats, paths, nodes) as (watcher, http):
        kv = await watcher.key_value(OWNERS_BUCKET)
        owners = await until_owned(kv, units, set(nodes))
        assert owners["models"] != owners["health"]
        for node, path in paths.items():
            body_of = body(model("m", route(up)), model("m2", route(added)))
            body_of["database"]["path"] = str(tmp_path / node)
            write_config(path, body_of)

        reloaded = await http.post("/admin/config/reload", json={})
        assert reloaded.status_code == 200, reloaded.text

        async def served() -> bool:
            ask = {"model": "m2", "messages": HI, "max_tokens": 5}
            return (await http.post(CHAT, json=ask)).status_code == 200

        async def listed() -> bool:
            deep = await http.get("/health/deep")
            return eid("m2", added) in deep.json().get("endpoints", {})

        await _until(served, "m2 served")
        await _until(listed, "m2's endpoint in /health/deep")

        async def followed() -> bool:
            members = (await http.get("/admin/cluster/members")).json()["members"]
            running = {m["node_id"]: m["config_version"] for m in members}
            return running == {n: config_version(str(paths[n])) for n in nodes}

        await _until(followed, "each host's members entry naming the version it reloaded")

    assert (reloaded.json()["added"], reloaded.json()["removed"]) == (["m2"], [])
    assert reloaded.json()["node_id"] in nodes
    assert len(added.requests) >= 1


@pytest.mark.timeout(120)
async def test_a_cluster_reload_removing_a_model_an_admin_chain_names_is_refused_whole(
    own_nats: str,
    postgres_url: str,
    tmp_path: Path,
    processes: list[GatewayProcess],
) -> None:
    """The single host refuses it (``actors.config_owner``); a cluster applied it and the
    chain named a dead model. Whichever host takes the command, the chains' owner may run on
    the other: each of several reloads is refused, and nothing changed."""
    nodes = _pair_splitting("models", "steering")
    echo = {"kind": "echo"}

    def write(node: str, *models: dict[str, Any]) -> None:
        body = config(*models, admin_key=ADMIN, cluster=CLUSTER)
        body["database"] = {"path": str(tmp_path / node), "url": postgres_url}
        write_config(paths[node], body)

    paths = {node: tmp_path / f"{node}.yaml" for node in (*nodes, "ingress")}
    for node in paths:
        write(node, model("a", echo), model("b", echo))
    units = {s.name for s in build_tree(load_config(str(paths[nodes[0]])), request_log=True).specs}
    async with _cluster(processes, own_nats, paths, nodes) as (watcher, http):
        await until_owned(await watcher.key_value(OWNERS_BUCKET), units, set(nodes))
        made = await http.post("/admin/chains/create", json={"name": "team", "models": ["a", "b"]})
        for node in paths:
            write(node, model("a", echo))
        refused = [(await http.post("/admin/config/reload", json={})) for _ in range(4)]
        shown = (await http.post("/admin/config/show", json={})).json()
        chain = (await http.post("/admin/chains/get", json={"name": "team"})).json()
        ask = {"model": "b", "messages": HI, "max_tokens": 5}
        still = await http.post(CHAT, json=ask)
        await http.post("/admin/chains/set_models", json={"name": "team", "models": ["a"]})
        applied = await http.post("/admin/config/reload", json={})

    assert made.status_code == 200, made.text
    for answer in refused:
        assert answer.status_code == 400, answer.text
        assert (
            "chain 'team' names 'b', which is no model id of this config"
            in (answer.json()["error"]["message"])
        ), answer.text
    assert shown["models"] == ["a", "b"], shown
    assert [e["model"] for e in chain["models"]] == ["a", "b"]
    assert still.status_code == 200, still.text
    assert applied.status_code == 200, applied.text
    assert applied.json()["removed"] == ["b"]


@pytest.mark.timeout(120)
async def test_a_cluster_host_started_on_a_file_lacking_a_model_an_admin_chain_names_drops_it(
    own_nats: str,
    postgres_url: str,
    tmp_path: Path,
    processes: list[GatewayProcess],
) -> None:
    """The chain, kept in JetStream, came back naming the model nothing served, silently; one
    host drops it as it starts the chains' unit, as a single host does at startup."""
    echo = {"kind": "echo"}
    paths = {node: tmp_path / f"{node}.yaml" for node in ("r1", "ingress")}

    def write(*models: dict[str, Any]) -> None:
        for node, path in paths.items():
            body = config(*models, admin_key=ADMIN, cluster=CLUSTER)
            body["database"] = {"path": str(tmp_path / node), "url": postgres_url}
            write_config(path, body)

    def actors() -> Awaitable[GatewayProcess]:
        return spawn_actors(processes, paths["r1"], own_nats, "r1")

    write(model("a", echo), model("b", echo))
    host = await actors()
    async with _cluster(processes, own_nats, paths, ()) as (watcher, http):
        made = await http.post("/admin/chains/create", json={"name": "team", "models": ["a", "b"]})
        await asyncio.to_thread(host.stop)
        write(model("a", echo))
        since = time.time()
        await actors()

        async def answers() -> bool:
            got = await http.post("/admin/chains/get", json={"name": "team"})
            return got.status_code == 200

        await _until(answers, "the chains' owner answering again")
        shown = (await http.post("/admin/chains/get", json={"name": "team"})).json()
        async with watcher.replay(
            subjects.event("chains"), stream=subjects.EVENTS_STREAM, since=since
        ) as kept:
            with anyio.fail_after(WAIT):
                dropped = (await anext(aiter(kept))).message

    assert made.status_code == 200, made.text
    assert [e["model"] for e in shown["models"]] == ["a"]
    assert isinstance(dropped, ChainModelsDropped)
    assert (dropped.chain, dropped.models, dropped.before) == ("team", ("b",), ("a", "b"))
