"""What the multi-host e2e tests share: starting ``serve`` processes, writing their configs,
choosing node ids that put given units on one host, and reading or awaiting the units' owners
in JetStream."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from actors import build_tree
from actors.cluster import owner_of
from bus import BusClosedError
from gateway.process.config import load_config
from tests.e2e.conftest import PROCESS_WAIT, WAIT
from tests.fixtures.gateway import GatewayProcess

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from bus import KeyValue


def pair_moving_together(*units: str) -> tuple[str, str]:
    """Two node ids under which ``units`` are all placed on the same host (the victim)."""
    for n in range(1, 50):
        pair = ("a", f"b{n}")
        if len({owner_of(u, pair) for u in units}) == 1:
            return pair
    raise AssertionError("no such pair")


async def spawn_serve(started: list[GatewayProcess], *args: str) -> GatewayProcess:
    """A started ``serve`` process (stopped by the ``processes`` fixture, which also ends a
    start still waiting for its ready line)."""
    proc = GatewayProcess(["serve", *args])
    started.append(proc)
    try:
        async with asyncio.timeout(PROCESS_WAIT):
            return await asyncio.to_thread(proc.start)
    except TimeoutError:
        raise AssertionError(f"serve {' '.join(args)} not ready in {PROCESS_WAIT} s") from None


async def owners_of(kv: KeyValue) -> dict[str, str]:
    out: dict[str, str] = {}
    for unit in await kv.keys():
        entry = await kv.get(unit)
        if entry is not None:
            out[unit] = entry.value.decode()
    return out


async def until_owned(kv: KeyValue, units: set[str], by: set[str]) -> dict[str, str]:
    """The owners once every unit has one and the owners are exactly ``by``. Raises
    AssertionError naming the last owners seen when that takes over ``2 * WAIT``."""
    owners: dict[str, str] = {}
    try:
        async with asyncio.timeout(WAIT * 2):
            while True:
                try:
                    owners = await owners_of(kv)
                except BusClosedError:  # a node was lost: the bucket elects a new leader
                    continue
                if set(owners) == units and set(owners.values()) == by:
                    return owners
                await asyncio.sleep(0.1)  # the owners are in JetStream: poll the outcome
    except TimeoutError:
        raise AssertionError(f"units not owned by {by} in {WAIT * 2} s: {owners}") from None


def write_config(path: Path, body: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(body))
    return str(path)


@dataclass
class Deployment:
    """Actors hosts (one per node id, each with its own SQLite folder and the shared
    PostgreSQL) and one ingress on a NATS cluster."""

    configs: dict[str, str]  # node id -> its config file
    units: set[str]  # the placed units of the tree
    hosts: dict[str, GatewayProcess]
    ingress: GatewayProcess
    bus_url: str


async def deploy(
    started: list[GatewayProcess],
    folder: Path,
    base: dict[str, Any],
    nodes: Iterable[str],
    nats_urls: list[str],
    postgres_url: str,
) -> Deployment:
    """Start an actors host per node of ``nodes`` with ``base`` and an ingress beside them."""
    configs = {
        node: write_config(
            folder / f"{node}.yaml",
            {**base, "database": {"path": str(folder / node), "url": postgres_url}},
        )
        for node in nodes
    }
    first = next(iter(configs.values()))
    units = {s.name for s in build_tree(load_config(first), request_log=True).specs}
    bus_url = ",".join(nats_urls)
    hosts = {
        node: await spawn_serve(
            started, "--config", path, "--bus", bus_url, "--role", "actors", "--node-id", node
        )
        for node, path in configs.items()
    }
    ingress = await spawn_serve(
        started, "--config", first, "--bus", bus_url, "--role", "ingress", "--port", "0"
    )
    return Deployment(configs, units, hosts, ingress, bus_url)
