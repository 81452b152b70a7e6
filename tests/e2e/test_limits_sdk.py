"""Limits through the real gateway on both buses: RPM, TPM, concurrency and budget refuse the
request that crosses them before any upstream is called, in the caller's API shape, with
``Retry-After`` and the ``x-ratelimit-*`` headers; refusals never count against an
endpoint."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from typing import TYPE_CHECKING, Any

import anyio
import openai
import pytest

import gateway.process.actor_host
from actors import build_tree
from schemas import subjects
from schemas.limits import BudgetThreshold, LimitSettle
from tests.e2e.conftest import HI, WAIT, eid, model, route, watch
from tests.e2e.keys_support import admin_http, cli, keys_config
from tests.e2e.limits_support import SURFACES, call, new_key, set_limit
from tests.fixtures.upstream import FakeUpstream, Hang, Held, Stream

if TYPE_CHECKING:
    from pathlib import Path

    from actors.supervisor import Supervisor
    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

PRICING = {"prompt": 2.0, "completion": 10.0}  # USD per million tokens


def _config(tmp_path: Path, up: FakeUpstream, **extra: Any) -> dict[str, Any]:
    return keys_config(tmp_path, model("m", route(up, pricing=PRICING)), **extra)


def _refused_shape(surface: str, code: str | None, expected: str) -> bool:
    # Anthropic's error shape has no code: its type says what happened.
    return code == ("rate_limit_error" if surface == "messages" else expected)


@pytest.mark.parametrize("surface", SURFACES)
async def test_rpm_refuses_the_request_over_the_limit_on_every_surface(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    surface: str,
) -> None:
    gw = await gateway_factory(_config(tmp_path, fake_upstream))
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, rpm=2)

    first = await call(gw, surface, key)
    second = await call(gw, surface, key)
    third = await call(gw, surface, key)

    assert (first.status, second.status) == (200, 200)
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    assert third.status == 429
    assert _refused_shape(surface, third.code, "rate_limited")
    assert 1 <= int(third.headers["retry-after"]) <= 60
    assert third.headers["x-ratelimit-remaining-requests"] == "0"
    assert third.headers["x-ratelimit-reset-requests"].endswith("s")
    assert len(fake_upstream.requests) == 2  # the refusal never reached the upstream
    health = (await admin_http(gw).get("/health/deep")).json()
    assert health["endpoints"][eid("m", fake_upstream)]["consecutive_failures"] == 0


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_request_refused_before_routing_does_not_count_against_rpm(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    surface: str,
) -> None:
    gw = await gateway_factory(_config(tmp_path, fake_upstream))
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, rpm=2)

    # A typo in the model, and a chain that does not exist: refused before any routing.
    typo = await call(gw, surface, key, model="mm")
    chain = await call(gw, surface, key, model="auto:no-such-chain")
    first = await call(gw, surface, key)
    second = await call(gw, surface, key)

    assert (typo.status, chain.status) == (404, 400)
    assert not any(h.startswith("x-ratelimit") for h in typo.headers)
    assert (first.status, second.status) == (200, 200), second.body
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert (await admin_usage(gw, f"key:{key_id}"))["requests_last_minute"] == 2


async def test_a_key_without_limits_gets_no_rate_headers(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    gw = await gateway_factory(_config(tmp_path, fake_upstream))
    key, _ = await new_key(gw)
    out = await call(gw, "chat", key)
    assert out.status == 200
    assert not any(h.startswith("x-ratelimit") for h in out.headers)


async def test_tpm_reserves_max_tokens_and_reconciles_to_the_reported_usage(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    gw = await gateway_factory(_config(tmp_path, fake_upstream))
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, tpm=300)

    # The reservation (prompt estimate + max_tokens) must fit: 500 never will.
    too_big = await call(gw, "chat", key, max_tokens=500)
    assert too_big.status == 429 and too_big.code == "rate_limited"
    assert fake_upstream.requests == []

    # 15 tokens used (10 + 5 reported) replace each 100-token reservation.
    for _ in range(3):
        assert (await call(gw, "chat", key, max_tokens=100)).status == 200
    got = await admin_usage(gw, f"key:{key_id}")
    assert got["tokens_last_minute"] == 45
    assert got["in_flight"] == 0
    out = await call(gw, "chat", key, max_tokens=250)
    assert out.status == 429
    assert out.headers["x-ratelimit-limit-tokens"] == "300"
    assert 1 <= int(out.headers["retry-after"]) <= 60


async def admin_usage(gw: Any, subject: str) -> dict[str, Any]:
    kind, _, ident = subject.partition(":")
    resp = await admin_http(gw).get(f"/admin/limits/{kind}/{ident}")
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["usage"])


async def test_an_image_is_reserved_as_an_image_not_as_its_base64_bytes(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    # A 450 KB image was reserved at its base64's bytes / 4, 150,000 tokens: refused by a
    # tpm of 100,000 whatever max_tokens said, and by a $0.10 budget as "up to $0.301".
    up = route(fake_upstream, pricing=PRICING, input_modalities=["text", "image"])
    gw = await gateway_factory(keys_config(tmp_path, model("m", up)))
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, tpm=100_000, budget="0.10/day")
    png = base64.b64encode(os.urandom(450_000)).decode()
    url = {"url": f"data:image/png;base64,{png}"}
    answer = await gw.openai(key).chat.completions.create(
        model="m",
        max_tokens=100,
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": url}]}],
    )
    assert answer.choices[0].message.content
    source = {"type": "base64", "media_type": "image/png", "data": png}
    said = await gw.anthropic(key).messages.create(
        model="m",
        max_tokens=100,
        messages=[{"role": "user", "content": [{"type": "image", "source": source}]}],
    )
    assert said.content
    usage = await admin_usage(gw, f"key:{key_id}")
    assert usage["tokens_last_minute"] == 2 * 15  # settled at what the upstream reported


async def test_concurrency_refuses_while_one_runs_and_a_cancellation_releases_it(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    # Not about the owner's answer time: a loaded machine must not turn a 429 into a 503.
    gw = await gateway_factory(
        _config(tmp_path, fake_upstream, limits={"decision_timeout_seconds": 30})
    )
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, concurrency=1)
    fake_upstream.enqueue(Hang())
    async with watch(gw, subjects.LIMITS_SETTLE) as settles:
        running = asyncio.create_task(call(gw, "chat", key))
        await fake_upstream.wait_for_requests(1)
        second = await call(gw, "messages", key)
        assert second.status == 429 and second.code == "rate_limit_error"
        assert int(second.headers["retry-after"]) >= 1
        running.cancel()  # the client goes away
        with contextlib.suppress(asyncio.CancelledError):
            await running
        done = await settles.next(LimitSettle)
    assert done.tokens == 0  # nothing was answered
    assert (await admin_usage(gw, f"key:{key_id}"))["in_flight"] == 0
    assert (await call(gw, "chat", key)).status == 200


async def test_streams_reconcile_to_usage_or_to_what_was_sent_when_cut(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    gw = await gateway_factory(_config(tmp_path, fake_upstream))
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, tpm=100_000)
    client = gw.openai(key)
    async with watch(gw, subjects.LIMITS_SETTLE) as settles:
        stream = await client.chat.completions.create(
            model="m",
            messages=HI,
            stream=True,
            max_tokens=500,
            stream_options={"include_usage": True},
        )
        async for _ in stream:
            pass
        full = await settles.next(LimitSettle)
        assert full.tokens == 15  # the usage the upstream reported replaced the 500+
        fake_upstream.enqueue(Stream(cut_after=1))
        cut = await client.chat.completions.create(
            model="m", messages=HI, stream=True, max_tokens=500
        )
        with contextlib.suppress(openai.APIError):
            async for _ in cut:
                pass
        broken = await settles.next(LimitSettle)
    # No usage reported: the prompt estimate plus what was sent, not the reservation.
    assert 0 < broken.tokens < 500
    usage = await admin_usage(gw, f"key:{key_id}")
    assert usage["tokens_last_minute"] == full.tokens + broken.tokens
    assert usage["in_flight"] == 0


@pytest.mark.parametrize("status", [429, 402])
async def test_an_exhausted_budget_refuses_with_budget_exceeded_and_a_soft_event(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    status: int,
) -> None:
    gw = await gateway_factory(_config(tmp_path, fake_upstream, limits={"budget_status": status}))
    key, _ = await new_key(gw, org="acme")
    # One request costs (10 * 2 + 5 * 10) / 1e6 = 70 micro-USD; the org may spend 100.
    await set_limit(gw, "org", "acme", budget="0.0001/day", soft_fraction=0.5)
    async with watch(gw, subjects.event("budget")) as events:
        assert (await call(gw, "chat", key, max_tokens=5)).status == 200
        soft = await events.next(BudgetThreshold)
    assert soft.subject == "org:acme" and not soft.exhausted
    assert soft.spent_usd == pytest.approx(70e-6)
    out = await call(gw, "responses", key, max_output_tokens=16)
    assert out.status == status and out.code == "budget_exceeded"
    assert 1 <= int(out.headers["retry-after"]) <= 86_400
    # Anthropic's SDK types a 402 as billing_error (types/shared/billing_error_object.py).
    msg = await call(gw, "messages", key, max_tokens=16)
    assert msg.status == status
    assert msg.code == ("billing_error" if status == 402 else "rate_limit_error")
    assert len(fake_upstream.requests) == 1


async def test_limits_and_counters_survive_a_restart_of_their_owner(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    gw = await gateway_factory(_config(tmp_path, fake_upstream))
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, rpm=1)
    assert (await call(gw, "chat", key)).status == 200
    await gw.stop()
    again = await gateway_factory(_config(tmp_path, fake_upstream))
    got = (await admin_http(again).get(f"/admin/limits/key/{key_id}")).json()
    assert got["limit"] == {"rpm": 1}
    assert got["usage"]["requests_last_minute"] == 1
    out = await call(again, "chat", key)
    assert out.status == 429 and out.code == "rate_limited"
    assert len(fake_upstream.requests) == 1


@pytest.fixture
def roots(monkeypatch: pytest.MonkeyPatch) -> list[Supervisor]:
    """The actor trees of the gateways this test starts (to stop one owner alone)."""
    built: list[Supervisor] = []
    real = build_tree

    def build(*args: Any, **kw: Any) -> Supervisor:
        root = real(*args, **kw)
        built.append(root)
        return root

    monkeypatch.setattr(gateway.process.actor_host, "build_tree", build)
    return built


async def test_with_the_owner_stopped_a_limited_key_fails_closed_with_503(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    roots: list[Supervisor],
) -> None:
    gw = await gateway_factory(
        _config(tmp_path, fake_upstream, limits={"decision_timeout_seconds": 0.5})
    )
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, rpm=100)
    await roots[0].remove_child("limits")
    for surface in ("chat", "messages"):
        out = await call(gw, surface, key)
        assert out.status == 503
        assert out.code == ("overloaded_error" if surface == "messages" else "limits_unavailable")
        assert int(out.headers["retry-after"]) >= 1
    assert fake_upstream.requests == []
    other, _ = await new_key(gw, user="bob")  # no limit: served as usual
    assert (await call(gw, "chat", other)).status == 200


async def test_with_the_owner_stopped_fail_open_admits_and_counts_when_it_is_back(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    roots: list[Supervisor],
) -> None:
    gw = await gateway_factory(
        _config(
            tmp_path,
            fake_upstream,
            limits={"fail_open": True, "decision_timeout_seconds": 0.5, "lease_ttl_seconds": 0.6},
        )
    )
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, rpm=100)
    root = roots[0]
    spec = next(s for s in root.specs if s.name == "limits")
    await root.remove_child("limits")
    assert (await call(gw, "chat", key)).status == 200
    assert len(fake_upstream.requests) == 1
    async with watch(gw, subjects.LIMITS_SETTLE) as settles:
        await root.add_child(spec)
        with anyio.fail_after(WAIT):
            while (await admin_usage(gw, f"key:{key_id}"))["requests_last_minute"] != 1:
                await settles.next(LimitSettle)  # the owed settle, retried until acked
    assert (await admin_usage(gw, f"key:{key_id}"))["tokens_last_minute"] == 15


async def test_keys_create_with_limits_reaches_the_running_owner(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    gw = await gateway_factory(_config(tmp_path, fake_upstream))
    made = await cli(
        tmp_path,
        "create",
        "--org",
        "acme",
        "--user",
        "carol",
        "--role",
        "pro",
        "--rpm",
        "1",
        "--budget",
        "10/month",
        "--concurrency",
        "4",
    )
    assert made["limit_delivered"] in ("socket", "bus")
    got = (await admin_http(gw).get(f"/admin/limits/key/{made['id']}")).json()
    assert got["limit"] == {
        "rpm": 1,
        "concurrency": 4,
        "budget_usd": 10.0,
        "budget_period": "month",
    }
    assert (await call(gw, "chat", made["key"])).status == 200
    assert (await call(gw, "chat", made["key"])).status == 429


async def test_bad_limits_are_refused_in_the_admin_shape(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    gw = await gateway_factory(_config(tmp_path, fake_upstream))
    http = admin_http(gw)
    for path, body in (
        ("/admin/limits/key/k-1", {"rpm": 0}),
        ("/admin/limits/key/k-1", {}),
        ("/admin/limits/user/alice", {"rpm": 1}),
        ("/admin/limits/planet/x", {"rpm": 1}),
        ("/admin/limits/org/acme", {"budget": "ten/month"}),
    ):
        resp = await http.put(path, json=body)
        assert resp.status_code == 400, (path, resp.text)
        assert resp.json()["error"]["code"] == "invalid_request"
    assert (await http.put("/admin/limits/role/pro", json={"rpm": 3})).status_code == 200
    assert (await http.get("/admin/limits")).json()["limits"] == {"role:pro": {"rpm": 3}}
    assert (await http.delete("/admin/limits/role/pro")).json()["cleared"] is True
    assert (await http.get("/admin/limits")).json()["limits"] == {}
    no_key = await gw.http().put("/admin/limits/role/pro", json={"rpm": 3})
    assert no_key.status_code == 401
    made = await cli(
        tmp_path,
        "create",
        "--org",
        "a",
        "--user",
        "b",
        "--role",
        "pro",
        "--budget",
        "ten",
        check=False,
    )
    assert made is None  # refused before any key was made


async def test_a_role_default_limits_each_key_of_that_role_on_its_own(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    gw = await gateway_factory(_config(tmp_path, fake_upstream))
    one, _ = await new_key(gw, user="u1", role="free")
    two, _ = await new_key(gw, user="u2", role="free")
    await set_limit(gw, "role", "free", rpm=1)
    assert (await call(gw, "chat", one)).status == 200
    assert (await call(gw, "chat", one)).status == 429
    assert (await call(gw, "chat", two)).status == 200  # its own counters


async def test_steered_requests_in_flight_together_overshoot_a_budget_by_one_reservation(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    # A steered name's model is chosen after admission: it reserved $0, so every request
    # sent at once was admitted against a budget one of them nearly spends (4 of 4 here).
    gw = await gateway_factory(_config(tmp_path, fake_upstream))
    key, key_id = await new_key(gw)
    # About 17 prompt tokens and 1000 to complete at PRICING: $0.01 reserved each.
    await set_limit(gw, "key", key_id, budget="0.015/month")
    fake_upstream.set_default(Held())
    tasks = [
        asyncio.create_task(call(gw, "chat", key, model="auto:cheapest", max_tokens=1000))
        for _ in range(4)
    ]
    await fake_upstream.wait_for_requests(1)
    refused: list[asyncio.Task[Any]] = []
    with anyio.fail_after(WAIT):  # the other three are refused while the first one runs
        while len(refused) < 3:
            done, _ = await asyncio.wait(
                [t for t in tasks if t not in refused], return_when=asyncio.FIRST_COMPLETED
            )
            refused += done
    assert {(t.result().status, t.result().code) for t in refused} == {(429, "budget_exceeded")}
    fake_upstream.release_held()
    assert [o.status for o in await asyncio.gather(*tasks)].count(200) == 1
    assert len(fake_upstream.requests) == 1
