"""The NATS account setup compose.yaml documents, run for real: a nats-server started with
that very configuration (taken from the file's comments), one ``actors`` process and one
``ingress`` process each on its own user. Traffic flows; admin commands get through with the
admin credentials only; the ingress user can neither send admin commands nor read them (an
added provider key travels in one); a database key's secret is granted only to ingress and
actors credentials; no process logs a NATS password."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import httpx
import nats
import openai
import pytest
import yaml

from bus import encode, open_bus
from schemas import ErrorReply, ProviderSecretGrant, ProviderSecretRequest, subjects
from schemas.config import credential_id
from tests.e2e.conftest import CHAT, WAIT, chat, config, eid, model, route
from tests.e2e.keys_support import ask, keys_config, spent
from tests.fixtures.gateway import REPO, GatewayProcess
from tests.fixtures.nats import start_nats_server

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from nats.aio.client import Client
    from nats.aio.subscription import Subscription

    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, pytest.mark.nats]

PASSWORDS = {
    "ACTORS_NATS_PASSWORD": "pw-actors-3f9c",
    "INGRESS_NATS_PASSWORD": "pw-ingress-71ab",
    "ADMIN_NATS_PASSWORD": "pw-admin-c40e",
}
COMPOSE = REPO / "compose.yaml"
CONFIG_KEY, DATABASE_KEY = "sk-upstream-config-aaaa", "sk-upstream-database-dddd"


def documented_server_config(store: Path) -> str:
    """The ``nats-server.conf`` compose.yaml's comments document, with its store in ``store``
    (the passwords stay ``$VAR`` references, resolved from the server's environment)."""
    lines = COMPOSE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "jetstream {" in line)
    end = next(i for i in range(start, len(lines)) if lines[i].rstrip() == "#   }")
    body = "\n".join(line.removeprefix("#   ") for line in lines[start : end + 1])
    return body.replace("store_dir: /data", f'store_dir: "{store}"')


@pytest.fixture
def secured_nats(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """(host, port) of a nats-server running the documented configuration."""
    conf = tmp_path / "nats-server.conf"
    conf.write_text(documented_server_config(tmp_path / "js"))
    with start_nats_server(tmp_path / "js", config_file=conf, env=PASSWORDS) as url:
        host, port = url.removeprefix("nats://").rsplit(":", 1)
        yield host, int(port)


def as_user(where: tuple[str, int], user: str) -> str:
    password = PASSWORDS[f"{user.upper()}_NATS_PASSWORD"]
    return f"nats://{user}:{password}@{where[0]}:{where[1]}"


def _llmgw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _admin_command(bus: str, area: str, verb: str, *args: str) -> Any:
    """``llmgw admin AREA VERB --arg ...`` over ``bus``; its JSON answer."""
    argv = ["admin", area, verb, "--bus", bus]
    for arg in args:
        argv += ["--arg", arg]
    out = _llmgw(*argv)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def _start_actors_and_ingress(
    processes: list[GatewayProcess], cfg: Path, where: tuple[str, int]
) -> None:
    """An ``actors`` and an ``ingress`` process on their own users, started side by side (each
    start waits for its ready line); the ingress is appended last."""
    for role, extra in (("actors", []), ("ingress", ["--port", "0"])):
        bus = as_user(where, role)
        processes.append(
            GatewayProcess(["serve", "--config", str(cfg), "--role", role, "--bus", bus, *extra])
        )
    await asyncio.gather(*(asyncio.to_thread(p.start) for p in processes[-2:]))


async def test_documented_nats_accounts_run_the_gateway_and_keep_admin_to_admins(
    secured_nats: tuple[str, int],
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    processes: list[GatewayProcess],
) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            config(
                model("m", route(fake_upstream)), database={"path": str(tmp_path / "gw.sqlite3")}
            )
        )
    )
    await _start_actors_and_ingress(processes, cfg, secured_nats)
    ingress = processes[-1]

    async with httpx.AsyncClient(base_url=ingress.url, timeout=WAIT) as client:
        served = await client.post(CHAT, json=chat("m"))
    # Side by side: the ingress user's command ends only by its --timeout (the server's
    # refusal reaches a client as an asynchronous error, not as the request's answer), and
    # the admin's command runs meanwhile.
    by_admin, by_ingress = await asyncio.gather(
        asyncio.to_thread(_llmgw, "admin", "show", "--bus", as_user(secured_nats, "admin")),
        asyncio.to_thread(
            _llmgw, "admin", "show", "--timeout", "2", "--bus", as_user(secured_nats, "ingress")
        ),
    )

    refusals: asyncio.Queue[Exception] = asyncio.Queue()

    async def on_error(exc: Exception) -> None:
        await refusals.put(exc)

    eavesdropper = await nats.connect(
        as_user(secured_nats, "ingress"), error_cb=on_error, allow_reconnect=False
    )
    try:
        await eavesdropper.subscribe("llmgw.admin.>")
        await eavesdropper.flush()
        refused = await asyncio.wait_for(refusals.get(), WAIT)
    finally:
        await eavesdropper.close()
    ready = " ".join(p.ready_line for p in processes)
    logs = "".join([await asyncio.to_thread(p.stop) for p in processes])
    processes.clear()

    assert served.status_code == 200, served.text
    assert by_admin.returncode == 0, by_admin.stderr
    assert json.loads(by_admin.stdout)["models"] == ["m"]
    assert by_ingress.returncode == 2, by_ingress.stderr  # not delivered
    assert "permissions violation" in str(refused).lower()
    assert "llmgw.admin.>" in str(refused)
    for password in PASSWORDS.values():
        assert password not in logs + ready + by_admin.stderr + by_ingress.stderr


async def test_only_ingress_and_actors_credentials_may_ask_for_a_provider_secret_grant(
    secured_nats: tuple[str, int],
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    processes: list[GatewayProcess],
) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            config(
                model("m", route(fake_upstream)), database={"path": str(tmp_path / "gw.sqlite3")}
            )
        )
    )
    actors = GatewayProcess(
        [
            "serve",
            "--config",
            str(cfg),
            "--role",
            "actors",
            "--bus",
            as_user(secured_nats, "actors"),
        ]
    )
    processes.append(actors)
    await asyncio.to_thread(actors.start)
    ask = ProviderSecretRequest(credential_id="k-none")

    ingress_bus = await open_bus(as_user(secured_nats, "ingress"))
    try:
        answer = await ingress_bus.request(
            subjects.KEYS_SECRET_GRANT, ask, reply_type=ProviderSecretGrant, timeout=WAIT
        )
    finally:
        await ingress_bus.aclose()

    refusals: asyncio.Queue[Exception] = asyncio.Queue()

    async def on_error(exc: Exception) -> None:
        await refusals.put(exc)

    operator = await nats.connect(
        as_user(secured_nats, "admin"), error_cb=on_error, allow_reconnect=False
    )
    try:
        await operator.publish(subjects.KEYS_SECRET_GRANT, encode(ask), reply="_INBOX.x")
        await operator.flush()
        refused = await asyncio.wait_for(refusals.get(), WAIT)
    finally:
        await operator.close()

    # The ingress user is answered (an unknown id: refused by the owner, not by NATS) ...
    assert isinstance(answer, ErrorReply) and answer.code == "route_not_found"
    # ... an operator's admin credentials may not even ask.
    assert "permissions violation" in str(refused).lower()
    assert subjects.KEYS_SECRET_GRANT in str(refused)


# The owners' side of key lookups and secret grants: an ingress-user client may not listen
# there (it could answer with a forged key, or learn who asks for what).
OWNER_SIDE = (
    subjects.AUTH_KEYS_LOOKUP,
    subjects.AUTH_STATE_GET,
    subjects.KEYS_SECRET_GRANT,
    subjects.KEYS_REGISTRY_GET,
)


class _Spy:
    """A raw NATS client on one user's credentials that tries to read inboxes; what the server
    refused and what reached each subscription."""

    def __init__(self) -> None:
        self.refusals: asyncio.Queue[Exception] = asyncio.Queue()
        self.subs: dict[str, Subscription] = {}
        self.nc: Client | None = None

    async def open(self, url: str, *subjects_: str) -> None:
        async def on_error(exc: Exception) -> None:
            await self.refusals.put(exc)

        self.nc = await nats.connect(url, error_cb=on_error, allow_reconnect=False)
        for subject in subjects_:
            self.subs[subject] = await self.nc.subscribe(subject)
        await self.nc.flush()

    async def refused(self, n: int) -> str:
        """The text of the first ``n`` refusals (waits for them)."""
        return " ".join([str(await asyncio.wait_for(self.refusals.get(), WAIT)) for _ in range(n)])

    async def seen(self, subject: str) -> list[bytes]:
        """What reached ``subject``'s subscription so far. The flush's PONG comes after any
        message the server already routed to this connection."""
        assert self.nc is not None
        await self.nc.flush()
        sub = self.subs[subject]
        return [(await sub.next_msg(timeout=WAIT)).data for _ in range(sub.pending_msgs)]

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()


async def test_a_user_cannot_read_another_users_inbox_so_grants_and_new_keys_stay_private(
    secured_nats: tuple[str, int],
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    processes: list[GatewayProcess],
) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            keys_config(
                tmp_path, model("m", route(fake_upstream, api_keys=[CONFIG_KEY])), auth="required"
            )
        )
    )
    await _start_actors_and_ingress(processes, cfg, secured_nats)
    ingress = processes[-1]
    # An observability consumer on the admin user, and a rogue client on the ingress user.
    observer, rogue = _Spy(), _Spy()
    try:
        await observer.open(
            as_user(secured_nats, "admin"),
            "_INBOX.>",
            "_INBOX_ingress.>",
            "_INBOX_actors.>",
            "_INBOX_admin.>",
        )
        await rogue.open(
            as_user(secured_nats, "ingress"),
            "_INBOX.>",
            "_INBOX_admin.>",
            "_INBOX_actors.>",
            *OWNER_SIDE,
        )
        observer_refused = await observer.refused(3)
        rogue_refused = await rogue.refused(3 + len(OWNER_SIDE))

        admin = as_user(secured_nats, "admin")
        # Three independent admin commands, each its own CLI process: run side by side.
        added, _, made = await asyncio.gather(
            asyncio.to_thread(
                _admin_command,
                admin,
                "provider_keys",
                "add",
                f"key={DATABASE_KEY}",
                f"endpoint={eid('m', fake_upstream)}",
            ),
            asyncio.to_thread(
                _admin_command,
                admin,
                "provider_keys",
                "reserve",
                f"key={CONFIG_KEY}",
                "min_role=admin",
            ),
            asyncio.to_thread(
                _admin_command, admin, "api_keys", "create", "org=acme", "user=ops", "role=free"
            ),
        )
        # The new key is looked up by the ingress, the database key granted to it, both as
        # replies on the ingress's inbox.
        async with openai.AsyncOpenAI(
            base_url=f"{ingress.url}/v1", api_key=made["key"], max_retries=0
        ) as client:
            await ask(client)
        events = await asyncio.to_thread(
            _llmgw, "events", "--since", "10m", "--count", "1", "--bus", admin
        )

        observed = {s: await observer.seen(s) for s in observer.subs}
        rogued = {s: await rogue.seen(s) for s in rogue.subs}
    finally:
        await observer.close()
        await rogue.close()

    assert added["credential_id"] == credential_id(DATABASE_KEY)
    assert spent(fake_upstream) == DATABASE_KEY  # granted to the ingress over the bus
    assert events.returncode == 0 and events.stdout.strip(), events.stderr
    for refusals, subjects_ in (
        (observer_refused, ["_INBOX.>", "_INBOX_ingress.>", "_INBOX_actors.>"]),
        (rogue_refused, ["_INBOX.>", "_INBOX_admin.>", "_INBOX_actors.>", *OWNER_SIDE]),
    ):
        assert refusals.lower().count("permissions violation") == len(subjects_)
        for subject in subjects_:  # nats-py lower-cases the server's error text
            assert f'"{subject.lower()}"' in refusals.lower()
    # Nothing reached another user's inbox; the admin user's own inbox (shared by every
    # admin-user client) did carry the admin replies, the new key among them.
    own = observed.pop("_INBOX_admin.>")
    assert any(made["key"].encode() in data for data in own)
    leaks = [data for seen in [*observed.values(), *rogued.values()] for data in seen]
    assert leaks == []
