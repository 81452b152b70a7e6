"""Nothing a client saw answered is lost when the actors process dies (kill -9) mid-load.

On NATS, one ``--role actors`` process owns the request log and the limits; two ``--role
ingress`` processes serve a key with a budget through the official openai SDK, concurrently.
Requests are answered before the kill, and others after it (held by the upstream while the
actors process dies, so their request-log rows and limit settles are sent while no owner
runs). Once the actors process is restarted, every answered request is in the request log
(its request row and its attempt row), once, the spend report adds each once, and so does
the key's budget.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
import yaml

from tests.e2e.conftest import HI, WAIT, model, route
from tests.e2e.keys_support import ADMIN, keys_config
from tests.e2e.limits_support import cli_key
from tests.fixtures.gateway import GatewayProcess
from tests.fixtures.upstream import FakeUpstream, Held

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.e2e, pytest.mark.nats]

BEFORE, DURING = 12, 6
PRICING = {"prompt": 2.0, "completion": 10.0}
# A restart of the actors process, then the ingress's next tries (an unanswered batch waits
# flush_ms + 5 s before it is sent again): generous on a loaded host.
RECOVERY_WAIT = 60.0


async def _spawn(started: list[GatewayProcess], *args: str) -> GatewayProcess:
    proc = GatewayProcess(["serve", *args])
    started.append(proc)
    return await asyncio.to_thread(proc.start)


async def _ask(client: openai.AsyncOpenAI) -> str:
    """One chat completion; the request id of its answer (a 200, or the SDK raises)."""
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=HI)
    raw.parse()
    return raw.headers["x-request-id"]


async def _admin(ingress: str, area: str, verb: str, **args: Any) -> Any:
    async with httpx.AsyncClient(
        base_url=ingress, timeout=WAIT, headers={"authorization": f"Bearer {ADMIN}"}
    ) as http:
        resp = await http.post(f"/admin/{area}/{verb}", json=args)
    assert resp.status_code == 200, resp.text
    return resp.json()


async def _logged(ingress: str, answered: set[str]) -> list[dict[str, Any]]:
    """The request log's rows once every ``answered`` request has its request row, or what
    it holds after RECOVERY_WAIT (the caller asserts)."""
    rows: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RECOVERY_WAIT
    while loop.time() < deadline:
        try:
            rows = (await _admin(ingress, "log", "query", since=0, limit=1000))["rows"]
        except AssertionError:  # the restarted owner does not answer yet (503)
            rows = []
        if answered <= {r["request_id"] for r in rows if r["kind"] == "request"}:
            return rows
        await asyncio.sleep(0.2)  # polling the owner's answer, bounded by RECOVERY_WAIT
    return rows


async def _spent(ingress: str, key_id: str, expected: float) -> float:
    """The key's budget spend once it reaches ``expected``, or after RECOVERY_WAIT."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RECOVERY_WAIT
    while True:
        got = await _admin(ingress, "limits", "get", kind="key", id=key_id)
        spent = float(got["usage"]["spent_usd"])
        if spent >= expected * 0.999 or loop.time() >= deadline:
            return spent
        await asyncio.sleep(0.2)  # polling the owner's answer, bounded by RECOVERY_WAIT


async def test_answered_requests_reach_the_log_and_the_spend_across_a_kill_of_the_actors(
    nats_url: str,
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    processes: list[GatewayProcess],
) -> None:
    cfg = keys_config(
        tmp_path,
        model("m", route(fake_upstream, pricing=PRICING)),
        bus={"url": nats_url},
    )
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    key, key_id = await cli_key(tmp_path, "--budget", "1000/month")
    common = ["--config", str(path), "--bus", nats_url]
    actors = await _spawn(processes, *common, "--role", "actors")
    ingresses = await asyncio.gather(
        *(_spawn(processes, *common, "--role", "ingress", "--port", "0") for _ in range(2))
    )
    clients = [
        openai.AsyncOpenAI(base_url=f"{i.url}/v1", api_key=key, max_retries=0) for i in ingresses
    ]
    try:
        answered = set(await asyncio.gather(*(_ask(clients[n % 2]) for n in range(BEFORE))))
        fake_upstream.enqueue(*[Held()] * DURING)
        held = [asyncio.create_task(_ask(clients[n % 2])) for n in range(DURING)]
        await fake_upstream.wait_for_requests(BEFORE + DURING, timeout=WAIT)
        assert actors.proc is not None
        actors.proc.kill()  # admitted and routed, not yet answered: the owners die now
        await asyncio.to_thread(actors.proc.wait)
        fake_upstream.release_held()
        during = set(await asyncio.gather(*held))  # answered while no owner runs
        answered |= during
        await _spawn(processes, *common, "--role", "actors")
        rows = await _logged(ingresses[0].url, answered)
        spend = await _admin(ingresses[1].url, "spend", "report", since=0, group_by="key")
        cost = next((r["cost_usd"] for r in rows if r["kind"] == "request"), 0.0)
        spent = await _spent(ingresses[0].url, key_id, len(answered) * cost)
    finally:
        for client in clients:
            await client.close()

    requests = [r for r in rows if r["kind"] == "request"]
    attempts = [r for r in rows if r["kind"] == "attempt"]
    assert len(answered) == BEFORE + DURING
    assert sorted(r["request_id"] for r in requests) == sorted(answered)  # each once
    assert sorted(r["request_id"] for r in attempts) == sorted(answered)
    assert cost > 0 and all(r["cost_usd"] == pytest.approx(cost) for r in requests)
    assert spend["total_usd"] == pytest.approx(len(answered) * cost)
    assert [(g["key"], g["requests"]) for g in spend["groups"]] == [(key_id, len(answered))]
    # The key's budget holds each answered request once: settles saved before the kill, and
    # those not yet saved or sent while no owner ran, kept by the ingresses until saved.
    assert spent == pytest.approx(len(answered) * cost)
