"""Steering scaled out on NATS: one ``--role actors`` process owns the chains and settings,
two ``--role ingress`` processes resolve from their views. A change made through one ingress
(or the CLI, on the bus) routes the other's requests as soon as its views hear the owner's
event, and survives the actors process restarting."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import yaml

from tests.e2e.conftest import CHAT, HI, WAIT, config, model, route
from tests.fixtures.gateway import REPO, GatewayProcess

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.fixtures.upstream import UpstreamFactory

pytestmark = [pytest.mark.e2e, pytest.mark.nats]

ADMIN = "adm-steering-nats"
AUTH = {"authorization": f"Bearer {ADMIN}"}


class _Deployment:
    """An actors process and two ingress processes on one NATS server."""

    def __init__(self, nats_url: str, config_path: Path) -> None:
        self._common = ["--config", str(config_path), "--bus", nats_url]
        self.started: list[GatewayProcess] = []
        self._actors: GatewayProcess | None = None

    async def _spawn(self, *args: str) -> GatewayProcess:
        proc = GatewayProcess(["serve", *self._common, *args])
        self.started.append(proc)
        return await asyncio.to_thread(proc.start)

    async def start(self) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
        self._actors = await self._spawn("--role", "actors")
        one, two = await asyncio.gather(
            self._spawn("--role", "ingress", "--port", "0"),
            self._spawn("--role", "ingress", "--port", "0"),
        )
        return (
            httpx.AsyncClient(base_url=one.url, timeout=WAIT),
            httpx.AsyncClient(base_url=two.url, timeout=WAIT),
        )

    async def restart_actors(self) -> None:
        assert self._actors is not None
        await asyncio.to_thread(self._actors.stop)
        self._actors = await self._spawn("--role", "actors")


@pytest.fixture
async def deployment(nats_url: str, tmp_path: Path) -> AsyncIterator[Any]:
    """``await start(config)`` -> (the deployment, ingress one, ingress two); every process
    is stopped afterwards."""
    made: list[_Deployment] = []

    async def start(
        cfg: dict[str, Any],
    ) -> tuple[_Deployment, httpx.AsyncClient, httpx.AsyncClient]:
        path = tmp_path / "gw.yaml"
        path.write_text(yaml.safe_dump({**cfg, "database": {"path": str(tmp_path / "db")}}))
        dep = _Deployment(nats_url, path)
        made.append(dep)
        one, two = await dep.start()
        return dep, one, two

    yield start
    for dep in made:
        for proc in reversed(dep.started):
            await asyncio.to_thread(proc.stop)


async def _model(client: httpx.AsyncClient, name: str) -> str:
    resp = await client.post(CHAT, json={"model": name, "messages": HI})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["model"])


async def _settled(client: httpx.AsyncClient, name: str, want: str) -> str:
    """The model ``client`` routes ``name`` to once its views have heard a change: an ingress
    follows the owners' state events, which reach it beside (not before) the answer to the
    change, so ask again while it still routes elsewhere; the last answer once WAIT is up."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    got = await _model(client, name)
    while got != want and loop.time() < deadline:
        await asyncio.sleep(0.05)
        got = await _model(client, name)
    return got


async def _cli(nats_url: str, *args: str) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli.main",
        "admin",
        *args,
        "--bus",
        nats_url,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


async def test_a_change_through_one_ingress_routes_the_others_and_survives_a_restart(
    deployment: Any,
    fake_upstreams: UpstreamFactory,
    nats_url: str,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    actors, one, two = await deployment(
        config(
            model("a", route(a), catalog={"tier": 2}),
            model("b", route(b)),
            admin_key=ADMIN,
            steering={"exploration": 0},
            routing={"affinity": {"enabled": False}},
        )
    )

    async with one, two:
        made = await one.post(
            "/admin/chains/create", json={"name": "duo", "models": ["b"]}, headers=AUTH
        )
        first = await _model(two, "auto:duo")
        await _cli(
            nats_url, "chains", "set_models", "--json", '{"name": "duo", "models": ["a", "b"]}'
        )
        second = [await _settled(two, "auto:duo", "a"), await _settled(one, "auto:duo", "a")]
        await one.post("/admin/chains/activate", json={"name": "duo"}, headers=AUTH)
        await one.post("/admin/steering/set_profile", json={"profile": "priority"}, headers=AUTH)
        await one.post(
            "/admin/chains/move", json={"name": "duo", "model": "b", "position": 1}, headers=AUTH
        )
        third = await _settled(two, "auto", "b")
        listed = await _cli(nats_url, "chains", "list")
        # The actors process restarts: its owners come back from their snapshots.
        await actors.restart_actors()
        after = [await _settled(two, "auto", "b"), await _settled(one, "auto:duo", "b")]

    assert made.status_code == 200, made.text
    assert first == "b"
    assert second == ["a", "a"]
    assert third == "b"
    assert [c["name"] for c in listed["chains"]] == ["duo"] and listed["active_chain"] == "duo"
    assert after == ["b", "b"]
