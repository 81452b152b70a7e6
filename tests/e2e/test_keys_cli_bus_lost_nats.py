"""``llmgw keys`` beside a running gateway that has lost its NATS connection: the local socket
answers (a gateway runs on the database) but the keys' owner cannot be reached, so the command
fails in one line, prints nothing secret and writes no key into the database behind the
running owner, whether it was given the database (``--db``) or the config naming the lost bus
(``--config``). Once NATS is back, the same command goes through the owner."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
import yaml

from gateway.cli import keys_offline
from tests.e2e.conftest import model
from tests.e2e.keys_support import db_path, keys_config
from tests.fixtures.gateway import REPO, start_gateway
from tests.fixtures.nats import start_nats_server, until_connected

if TYPE_CHECKING:
    from pathlib import Path


pytestmark = [pytest.mark.e2e, pytest.mark.nats]

WHO = ("--org", "acme", "--user", "ann", "--role", "admin", "--rpm", "5", "--json")
PROCESS_WAIT = 60.0  # a CLI process starting Python on a loaded machine


def _keys(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "keys", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=PROCESS_WAIT,
        check=False,
    )


async def test_keys_create_beside_a_gateway_that_lost_its_bus_fails_and_writes_no_key(
    tmp_path: Path,
) -> None:
    db = db_path(tmp_path)
    with start_nats_server(tmp_path / "nats") as url:
        port = int(url.rsplit(":", 1)[1])
        gw = await start_gateway(keys_config(tmp_path, model("m", {"kind": "echo"})), url)
        cfg = tmp_path / "gw.yaml"
        cfg.write_text(yaml.safe_dump({"database": {"path": db}, "bus": {"url": url}}))
    stopped = False
    try:
        assert gw.bus is not None
        await until_connected(gw.bus, False)  # the server is gone; nats-py reconnects

        by_db, by_config = await asyncio.gather(
            asyncio.to_thread(_keys, "create", "--db", db, *WHO),
            asyncio.to_thread(_keys, "create", "--config", str(cfg), *WHO),
        )

        for done in (by_db, by_config):
            assert done.returncode == 2, (done.returncode, done.stderr)
            assert done.stdout == ""  # no key, nothing a script could take for one
            assert "Traceback" not in done.stderr
            (line,) = done.stderr.splitlines()
            assert line.startswith(
                f"llmgw keys: the gateway on {db} is running but could not reach its keys owner"
            ), line
            assert "message bus (NATS)" in line and line.endswith("retry in a moment"), line
            assert "gk-" not in line
        assert await keys_offline.listing(db) == []  # nothing written behind the owner

        with start_nats_server(tmp_path / "nats", port=port):
            await until_connected(gw.bus, True)
            again = await asyncio.to_thread(_keys, "create", "--db", db, *WHO)
            assert again.returncode == 0, again.stderr
            made = json.loads(again.stdout)
            assert (made["via"], made["limit_delivered"]) == ("socket", "socket")
            stopped = True
            await gw.stop()  # while NATS is up: a gateway stops cleanly
        assert [row["id"] for row in await keys_offline.listing(db)] == [made["id"]]
    finally:
        if not stopped:
            await gw.stop()
