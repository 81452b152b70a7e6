"""The request log's loss bound, through a real ``llmgw serve`` process killed with SIGKILL.

Operators read the log (``llmgw logs``, ``log/query``) and flush it (``log/flush``) while
traffic flows; afterwards the store must still commit on its own, so a kill -9 loses only
what was not yet committed. Runs on ``inproc://`` and on NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import yaml

from tests.e2e.conftest import CHAT, WAIT, chat, config, model
from tests.fixtures.gateway import GatewayProcess

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.e2e

ADMIN = "adm-log-test"
AUTH = {"authorization": f"Bearer {ADMIN}"}
ROWS_PER_REQUEST = 2  # one attempt row and one request row


async def _send(client: httpx.AsyncClient, n: int) -> None:
    for _ in range(n):
        assert (await client.post(CHAT, json=chat("m"))).status_code == 200


async def _admin(client: httpx.AsyncClient, verb: str, **args: Any) -> dict[str, Any]:
    resp = await client.post(f"/admin/log/{verb}", json=args, headers=AUTH)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()
    return result


async def _committed(client: httpx.AsyncClient, rows: int) -> dict[str, Any]:
    """``log/stats`` once ``rows`` rows are committed by the store on its own (no flush), or
    the last answer after WAIT seconds (the caller asserts)."""
    stats = await _admin(client, "stats")
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(WAIT):
            while stats["written"] < rows:
                await asyncio.sleep(0.02)  # polling the owner's answer, bounded by WAIT
                stats = await _admin(client, "stats")
    return stats


def _request_rows(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(
            conn.execute("SELECT count(*) FROM request_log WHERE kind = 'request'").fetchone()[0]
        )


@pytest.mark.parametrize("verb", ["query", "flush"])
async def test_killed_gateway_keeps_every_request_committed_after_a_log_query_or_flush(
    bus_url: str,
    tmp_path: Path,
    processes: list[GatewayProcess],
    verb: str,
) -> None:
    db = tmp_path / "gw.sqlite3"
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            config(
                model("m", {"kind": "echo"}),
                admin_key=ADMIN,
                database={"path": str(db)},
                log={"batch_rows": 16, "flush_ms": 100},
            )
        )
    )
    gw = GatewayProcess(["serve", "--config", str(cfg), "--bus", bus_url, "--port", "0"])
    processes.append(gw)
    await asyncio.to_thread(gw.start)
    async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as client:
        await _send(client, 10)
        first = await _committed(client, 10 * ROWS_PER_REQUEST)
        await _admin(client, verb)  # what `llmgw logs` does (query) or an operator (flush)
        await _send(client, 25)  # a batch and a half: the batch size and the timer commit
        second = await _committed(client, 35 * ROWS_PER_REQUEST)
        await _admin(client, verb)
        await _send(client, 5)  # under a batch: only the timer commits them
        third = await _committed(client, 40 * ROWS_PER_REQUEST)
    assert gw.proc is not None
    gw.proc.kill()
    await asyncio.to_thread(gw.proc.wait)

    assert first["written"] == 10 * ROWS_PER_REQUEST
    assert (second["written"], third["written"]) == (70, 80), (second, third)
    assert third["pending"] == 0
    assert _request_rows(db) == 40
