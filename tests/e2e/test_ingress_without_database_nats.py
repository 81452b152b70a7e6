"""An ingress with no path to the actors' database works: keys and provider keys reach it
from their owners over NATS.

One ``--role actors`` process owns the SQLite file; one ``--role ingress`` process runs in
another directory with a config whose ``database.path`` cannot exist (its parent is a regular
file), under an audit hook (``sitecustomize``) that refuses and records every SQLite connection,
every open of a path in the actors' directory and every import of the ``actors`` package.
Through the ingress's admin API: a gateway API key is created (auth closes at once), serves,
and is refused as soon as it is revoked; a provider key added over the admin API serves the
next request (its secret granted by the key registry), and a reservation of the configured
key for ``pro`` applies to the next callers.
"""

from __future__ import annotations

import asyncio
import os
import textwrap
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
import yaml

from schemas.config import credential_id
from tests.e2e.conftest import CHAT, HI, WAIT, chat, config, eid, model, route
from tests.fixtures.gateway import GatewayProcess

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, pytest.mark.nats]

ADMIN = "boot-admin-key-for-the-split-test"
UP_KEY, DB_KEY = "sk-configured-upstream-key", "sk-added-through-the-admin-api"

_GUARD = textwrap.dedent('''
    """Installed into the ingress process only: the actors' package and database must stay
    out of its reach."""
    import os
    import sys

    _FORBIDDEN = tuple(os.environ["LLMGW_TEST_FORBIDDEN"].split(os.pathsep))
    _REPORT = os.environ["LLMGW_TEST_VIOLATIONS"]

    def _path(arg):
        if isinstance(arg, (str, bytes, os.PathLike)):
            return os.path.abspath(os.fsdecode(arg))
        return None

    def _hook(event, args):
        if event == "sqlite3.connect":
            what = repr(args[0])
        elif event == "import" and (args[0] == "actors" or args[0].startswith("actors.")):
            what = args[0]
        elif event == "open" and args and (p := _path(args[0])) and p.startswith(_FORBIDDEN):
            what = p
        else:
            return
        with open(_REPORT, "a") as report:
            report.write(f"{event} {what}\\n")
        raise RuntimeError(f"the ingress may not {event} {what}")

    sys.addaudithook(_hook)
    with open(os.environ["LLMGW_TEST_ARMED"], "w") as armed:
        armed.write("armed\\n")
''')


async def _start(proc: GatewayProcess, started: list[GatewayProcess]) -> GatewayProcess:
    started.append(proc)
    return await asyncio.to_thread(proc.start)


def _config(up: FakeUpstream, database: Path, nats_url: str) -> dict[str, Any]:
    return config(
        model("m", route(up, api_keys=[UP_KEY])),
        database={"path": str(database)},
        bus={"url": nats_url},
        admin_key=ADMIN,
        auth_cache_seconds=3600,
        routing={"key_pool": {}, "bench": {"failures": 50}},
        circuit={"failure_threshold": 50, "cooldown_seconds": 30},
    )


async def _ask(client: openai.AsyncOpenAI) -> Any:
    return await client.chat.completions.create(model="m", messages=HI)


async def test_an_ingress_that_cannot_reach_the_database_serves_keys_from_their_owners(
    nats_url: str,
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    processes: list[GatewayProcess],
) -> None:
    actors_dir, ingress_dir, guard_dir = (tmp_path / d for d in ("actors", "ingress", "guard"))
    for d in (actors_dir, ingress_dir, guard_dir):
        d.mkdir()
    database = actors_dir / "gateway.sqlite3"
    (actors_dir / "gw.yaml").write_text(yaml.safe_dump(_config(fake_upstream, database, nats_url)))
    blocker = ingress_dir / "not-a-directory"
    blocker.write_text("a file: no database can be created below it\n")
    unreachable = blocker / "gateway.sqlite3"
    (ingress_dir / "gw.yaml").write_text(
        yaml.safe_dump(_config(fake_upstream, unreachable, nats_url))
    )
    (guard_dir / "sitecustomize.py").write_text(_GUARD)
    violations, armed = tmp_path / "violations.txt", tmp_path / "armed.txt"

    await _start(
        GatewayProcess(["serve", "--config", "gw.yaml", "--role", "actors"], cwd=actors_dir),
        processes,
    )
    ingress = await _start(
        GatewayProcess(
            ["serve", "--config", "gw.yaml", "--role", "ingress", "--port", "0"],
            cwd=ingress_dir,
            env={
                "PYTHONPATH": str(guard_dir),
                "LLMGW_TEST_FORBIDDEN": os.pathsep.join([str(actors_dir), str(blocker)]),
                "LLMGW_TEST_VIOLATIONS": str(violations),
                "LLMGW_TEST_ARMED": str(armed),
            },
        ),
        processes,
    )

    clients: list[openai.AsyncOpenAI] = []

    def sdk(key: str) -> openai.AsyncOpenAI:
        clients.append(
            openai.AsyncOpenAI(
                base_url=f"{ingress.url}/v1", api_key=key, max_retries=0, timeout=WAIT
            )
        )
        return clients[-1]

    async with (
        httpx.AsyncClient(
            base_url=ingress.url, timeout=WAIT, headers={"authorization": f"Bearer {ADMIN}"}
        ) as admin,
        httpx.AsyncClient(base_url=ingress.url, timeout=WAIT) as anonymous,
    ):
        assert (await anonymous.post(CHAT, json=chat("m"))).status_code == 200  # auth open
        made = await admin.post("/admin/keys", json={"org": "acme", "user": "ann", "role": "free"})
        assert made.status_code == 201, made.text
        pro = await admin.post("/admin/keys", json={"org": "acme", "user": "bo", "role": "pro"})
        free_key, pro_key = made.json()["key"], pro.json()["key"]

        closed = await anonymous.post(CHAT, json=chat("m"))  # the first key closed /v1 at once
        await _ask(sdk(free_key))
        assert fake_upstream.requests[-1].credential == UP_KEY

        added = await admin.post(
            "/admin/provider-keys", json={"key": DB_KEY, "endpoint": eid("m", fake_upstream)}
        )
        reserved = await admin.post(
            "/admin/provider-keys/min-role-env", json={"key": UP_KEY, "min_role": "pro"}
        )
        await _ask(sdk(free_key))
        free_spent = fake_upstream.requests[-1].credential
        await _ask(sdk(pro_key))
        pro_spent = fake_upstream.requests[-1].credential

        revoked = await admin.post(f"/admin/keys/{made.json()['id']}/revoke")
        with pytest.raises(openai.AuthenticationError, match="revoked"):
            await _ask(sdk(free_key))
        await _ask(sdk(pro_key))  # the other key is untouched
    for client in clients:
        await client.close()

    await asyncio.to_thread(ingress.stop)
    assert closed.status_code == 401
    assert (added.status_code, reserved.status_code, revoked.status_code) == (201, 200, 200)
    assert added.json()["credential_id"] == credential_id(DB_KEY)
    assert (free_spent, pro_spent) == (DB_KEY, UP_KEY)  # the reservation holds for pro only
    assert armed.read_text() == "armed\n"  # the audit hook ran in the ingress
    assert not violations.exists(), violations.read_text()
    assert database.exists() and not unreachable.exists()
