"""Each kind of limit refuses the request that crosses it, on every client surface, through
the official SDKs, on both buses: 429 in the surface's shape, ``Retry-After``, the
``x-ratelimit-*`` headers of the limited axis, and nothing sent upstream."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import model, route
from tests.e2e.keys_support import admin_http, keys_config
from tests.e2e.limits_support import SURFACES, Outcome, call, set_limit
from tests.fixtures.upstream import Hang, UpstreamFactory

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

PRICING = {"prompt": 2.0, "completion": 10.0}  # a chat request costs 95*2 + 5*10 = 240 micro-USD


async def _key(gw: RunningGateway, user: str) -> tuple[str, str]:
    resp = await admin_http(gw).post(
        "/admin/keys", json={"org": f"org-{user}", "user": user, "role": "pro"}
    )
    assert resp.status_code == 201, resp.text
    made = resp.json()
    return str(made["key"]), str(made["id"])


def _refused(surface: str, out: Outcome, code: str) -> None:
    assert out.status == 429, (surface, out.status, out.body)
    assert out.code == ("rate_limit_error" if surface == "messages" else code)
    assert int(out.headers["retry-after"]) >= 1


@pytest.mark.parametrize("surface", SURFACES)
async def test_every_limit_refuses_the_request_that_crosses_it(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
    surface: str,
) -> None:
    up = await fake_upstreams("up1", prompt_tokens=95, completion_tokens=5)
    gw = await gateway_factory(
        keys_config(
            tmp_path, model("m", route(up, pricing=PRICING)), limits={"default_max_tokens": 5}
        )
    )
    kw: dict[str, Any] = {"max_tokens": 5} if surface == "messages" else {}

    rpm, rpm_id = await _key(gw, "rpm")
    await set_limit(gw, "key", rpm_id, rpm=1)
    assert (await call(gw, surface, rpm, **kw)).status == 200
    out = await call(gw, surface, rpm, **kw)
    _refused(surface, out, "rate_limited")
    assert out.headers["x-ratelimit-limit-requests"] == "1"
    assert out.headers["x-ratelimit-remaining-requests"] == "0"

    tpm, tpm_id = await _key(gw, "tpm")
    # The first reports 95 of them (and 5 more for a completion): the next, whose estimate is
    # at least one token ("hi"), crosses it.
    await set_limit(gw, "key", tpm_id, tpm=95)
    first = await call(gw, surface, tpm, **kw)
    assert first.status == 200 and first.headers["x-ratelimit-limit-tokens"] == "95"
    out = await call(gw, surface, tpm, **kw)
    _refused(surface, out, "rate_limited")
    assert int(out.headers["x-ratelimit-remaining-tokens"]) <= 10

    budget, budget_id = await _key(gw, "budget")
    await set_limit(gw, "key", budget_id, budget="0.0001/day")  # the first fits, then costs more
    assert (await call(gw, surface, budget, **kw)).status == 200
    _refused(surface, await call(gw, surface, budget, **kw), "budget_exceeded")

    conc, conc_id = await _key(gw, "conc")
    await set_limit(gw, "key", conc_id, concurrency=1)
    sent = len(up.requests)
    up.enqueue(Hang())
    running = asyncio.create_task(call(gw, surface, conc, **kw))
    await up.wait_for_requests(sent + 1)
    _refused(surface, await call(gw, surface, conc, **kw), "rate_limited")
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    # One admitted request per limit reached the upstream; no refusal did.
    assert len(up.requests) == sent + 1 == 4
