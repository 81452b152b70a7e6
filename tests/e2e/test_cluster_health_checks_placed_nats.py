"""Two ``--role actors`` hosts on NATS send one host's worth of health checks, not two.

The health-check loop polls a local deployment's ``/health`` every ``interval_seconds`` and
feeds the ``models`` unit; it runs only beside that unit's owner. Counted at the fake
upstream: a run of consecutive checks is spread over at least as many intervals as one loop
needs (two loops would send them twice as fast). When the owner is killed (kill -9), the
host that takes the unit over takes the checks over, still one loop's worth.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from actors import build_tree
from actors.cluster import OWNERS_BUCKET
from bus import open_bus
from gateway.process.config import load_config
from gateway.process.sidecars import HEALTH_CHECKED_UNIT
from tests.e2e.cluster_support import spawn_serve, until_owned, write_config
from tests.e2e.conftest import WAIT, config, model, route

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayProcess
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, pytest.mark.nats]

CLUSTER = {"enabled": True, "heartbeat_seconds": 0.5, "ttl_seconds": 1.5}
NODES = ("n1", "n2")
INTERVAL = 0.3
CHECKS = 8  # consecutive checks timed: one loop needs CHECKS intervals between the first and last
# One loop's checks are at least an interval apart (it sleeps that long between passes); the
# slack is for when the fake upstream got to read each one. Two loops take about half.
AT_LEAST_S = (CHECKS - 1) * INTERVAL * 0.75


async def _spread_of_next_checks(up: FakeUpstream) -> float:
    """Seconds between the first and the last of the next ``CHECKS`` health checks."""
    seen = len(up.requests_to("/health"))
    checks = await up.wait_for_requests(seen + CHECKS, timeout=WAIT * 2, path="/health")
    timed = checks[seen : seen + CHECKS]
    return timed[-1].t - timed[0].t


@pytest.mark.timeout(120)
async def test_health_checks_run_beside_the_models_owner_only_and_follow_it_on_takeover(
    own_nats: str,
    postgres_url: str,
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    processes: list[GatewayProcess],
) -> None:
    base = config(
        model("m", route(fake_upstream)),
        routing={"health_check": {"enabled": True, "interval_seconds": INTERVAL}},
        cluster=CLUSTER,
    )
    paths = {
        node: write_config(
            tmp_path / f"{node}.yaml",
            {**base, "database": {"path": str(tmp_path / node), "url": postgres_url}},
        )
        for node in NODES
    }
    units = {s.name for s in build_tree(load_config(paths["n1"]), request_log=True).specs}
    hosts = {
        node: await spawn_serve(
            processes, "--config", path, "--bus", own_nats, "--role", "actors", "--node-id", node
        )
        for node, path in paths.items()
    }
    watcher = await open_bus(own_nats, name="test-watcher")
    try:
        kv = await watcher.key_value(OWNERS_BUCKET)
        owner = (await until_owned(kv, units, set(NODES)))[HEALTH_CHECKED_UNIT]
        shared = await _spread_of_next_checks(fake_upstream)

        proc = hosts[owner].proc
        assert proc is not None
        proc.kill()
        (survivor,) = set(NODES) - {owner}
        await until_owned(kv, units, {survivor})
        taken_over = await _spread_of_next_checks(fake_upstream)
    finally:
        await watcher.aclose()

    assert shared >= AT_LEAST_S, f"{CHECKS} checks in {shared:.2f} s: more than one loop"
    assert taken_over >= AT_LEAST_S, f"{CHECKS} checks in {taken_over:.2f} s after the takeover"
