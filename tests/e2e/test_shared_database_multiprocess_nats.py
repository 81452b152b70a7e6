"""A second ``--role actors`` host whose request log would be in its own SQLite file is refused
at startup (exit 2, one line naming the remedy): the log and spend would be split between the
hosts' files. The first host, alone, runs with SQLite as before."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.e2e.conftest import config, model
from tests.fixtures.gateway import REPO, GatewayProcess

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.e2e, pytest.mark.nats]

CLUSTER = {"enabled": True, "heartbeat_seconds": 0.5, "ttl_seconds": 1.5}
PROCESS_WAIT = 60.0  # a gateway process starting Python on a loaded machine


def _write(path: Path, body: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(body))
    return str(path)


async def test_a_second_actors_host_with_the_request_log_in_sqlite_is_refused_naming_the_remedy(
    nats_url: str, tmp_path: Path, processes: list[GatewayProcess]
) -> None:
    base = config(model("m", {"kind": "echo"}), cluster=CLUSTER)
    cfgs = {
        node: _write(
            tmp_path / f"{node}.yaml", {**base, "database": {"path": str(tmp_path / node)}}
        )
        for node in ("first", "second")
    }
    serve = ["serve", "--bus", nats_url, "--role", "actors", "--node-id"]
    first = GatewayProcess([*serve, "first", "--config", cfgs["first"]])
    processes.append(first)
    await asyncio.to_thread(first.start)

    second = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gateway.cli.main", *serve, "second", "--config", cfgs["second"]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=PROCESS_WAIT,
        check=False,
    )

    assert first.proc is not None and first.proc.poll() is None  # alone, it runs on SQLite
    assert second.returncode == 2, second.stderr
    assert "Traceback" not in second.stderr
    (line,) = [ln for ln in second.stderr.splitlines() if ln.startswith("llmgw: ")]
    assert "first" in line and str(tmp_path / "second") in line
    assert "database.url: postgresql://" in line and "LLMGW_DATABASE_URL" in line
