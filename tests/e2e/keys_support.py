"""Helpers for the callers-and-credentials e2e tests: the ``llmgw keys`` CLI as a subprocess
(through the running gateway's local socket, or on the database file with none running),
configs with a database in the test's directory, and
bus queries of pool and endpoint state."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

from gateway.admin.local_socket import answers, socket_path
from gateway.cli import keys_offline
from schemas import (
    EndpointState,
    KeyPoolState,
    KeyPoolStateRequest,
    StateRequest,
    raise_for_reply,
    subjects,
)
from tests.e2e.conftest import HI, WAIT, config, gateway_bus
from tests.fixtures.gateway import REPO, RunningGateway

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.upstream import FakeUpstream

ADMIN = "boot-admin-key-for-tests"
SLOW_CIRCUIT = {"failure_threshold": 50, "cooldown_seconds": 30}


def db_path(tmp_path: Path) -> str:
    """The gateway's database in the test's directory."""
    return str(tmp_path / "gateway.sqlite3")


def keys_config(
    tmp_path: Path,
    *models: dict[str, Any],
    key_pool: dict[str, Any] | None = None,
    routing: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A config whose database lives in ``tmp_path``, keys uncached (so a CLI change shows at
    once), a breaker and a model bench that stay out of the way, limits counters saved every
    0.1 s, ``key_pool`` settings and other ``routing`` keys."""
    extra.setdefault("auth_cache_seconds", 0)
    extra.setdefault("admin_key", ADMIN)
    # The limits owner acknowledges settles when its next snapshot holds them, and a stopping
    # gateway waits for its acknowledgements: a short period keeps each test's stop short.
    extra["limits"] = {"snapshot_seconds": 0.1, **extra.get("limits", {})}
    return config(
        *models,
        circuit=SLOW_CIRCUIT,
        routing={"key_pool": key_pool or {}, "bench": {"failures": 50}, **(routing or {})},
        database={"path": db_path(tmp_path)},
        **extra,
    )


async def cli(
    tmp_path: Path, *args: str, check: bool = True, config_file: Path | None = None
) -> Any:
    """``python -m gateway.cli.main keys <args> --json`` for the test's database (``--db``, or the
    ``--config`` file when given: the gateway serving it, else the file); its JSON output."""
    where = ["--config", str(config_file)] if config_file else ["--db", db_path(tmp_path)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli.main",
        "keys",
        *args,
        *where,
        "--json",
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"llmgw keys {' '.join(args)} exited {proc.returncode}: {err.decode()}"
        )
    return json.loads(out) if out.strip() else None


async def create_keys(tmp_path: Path, *roles: str, org: str = "acme") -> list[str]:
    """One gateway API key per role (concurrently), as ``llmgw keys create --db`` makes it: in
    this process through the CLI's own offline path when no gateway serves the database (a
    Python start per key proves nothing the CLI tests do not), else with the CLI itself,
    which then goes through the running owner."""
    path = db_path(tmp_path)
    if await asyncio.to_thread(answers, socket_path(path)):  # tmp_path is absolute
        made = await asyncio.gather(
            *(
                cli(tmp_path, "create", "--org", org, "--user", f"user{i}", "--role", role)
                for i, role in enumerate(roles)
            )
        )
        return [m["key"] for m in made]
    keys = []
    for i, role in enumerate(roles):  # one writer at a time, as separate processes would be
        row, _ = await keys_offline.create(
            path, org=org, user=f"user{i}", role=role, name="", expires=None
        )
        keys.append(str(row["key"]))
    return keys


async def pool_state(gw: RunningGateway, endpoint: str) -> KeyPoolState:
    """The pool's state, asked of its owner."""
    reply = await gateway_bus(gw).request(
        subjects.keypool_get(endpoint), KeyPoolStateRequest(), reply_type=KeyPoolState, timeout=WAIT
    )
    return raise_for_reply(reply)


async def endpoint_state(gw: RunningGateway, endpoint: str) -> EndpointState:
    """The endpoint's health, asked of its owner."""
    reply = await gateway_bus(gw).request(
        subjects.endpoint_get(endpoint), StateRequest(), reply_type=EndpointState, timeout=WAIT
    )
    return raise_for_reply(reply)


def admin_http(gw: RunningGateway) -> Any:
    """An httpx client presenting the bootstrap admin key."""
    return gw.http(headers={"authorization": f"Bearer {ADMIN}"})


async def ask(client: Any, model_id: str = "m") -> Any:
    """One chat completion of ``model_id`` through ``client`` (an openai SDK client)."""
    return await client.chat.completions.create(model=model_id, messages=HI)


def spent(up: FakeUpstream) -> str | None:
    """The credential the upstream's last request carried."""
    return up.requests[-1].credential
