"""``/routing``, ``/health/deep`` and ``/metrics`` with auth on: a gateway key is needed,
and each caller sees only the models its role may call (a hidden model is absent, exactly
like one that does not exist); ``/metrics`` is for internal and admin keys unless
``metrics.public: true``. ``/health`` stays open for probes. Runs on both buses."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import assert_openai_error, model
from tests.e2e.keys_support import ADMIN, create_keys, keys_config

if TYPE_CHECKING:
    from pathlib import Path

    import httpx

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

ECHO = {"kind": "echo"}
OPEN, PREMIUM, STAFF = "open:echo", "premium:echo", "staff:echo"


def _models(**extra: Any) -> tuple[dict[str, Any], ...]:
    return (
        model("open", ECHO),
        model("premium", ECHO, required_role="pro"),
        model("staff", ECHO, required_role="internal"),
    )


def _as(gw: RunningGateway, key: str | None) -> httpx.AsyncClient:
    return gw.http(headers={"authorization": f"Bearer {key}"} if key else {})


async def _seen(client: httpx.AsyncClient) -> tuple[list[str], list[str]]:
    """(models of /routing, endpoints of /health/deep) as ``client`` sees them."""
    routing, deep = await client.get("/routing"), await client.get("/health/deep")
    assert routing.status_code == 200 and deep.status_code == 200, (routing.text, deep.text)
    return sorted(routing.json()["models"]), sorted(deep.json()["endpoints"])


async def test_routing_and_deep_health_need_a_key_and_show_only_what_the_role_may_see(
    gateway_factory: GatewayFactory,
    tmp_path: Path,
) -> None:
    free, pro, internal = await create_keys(tmp_path, "free", "pro", "internal")
    gw = await gateway_factory(keys_config(tmp_path, *_models()))
    anonymous = _as(gw, None)
    refused = [await anonymous.get(p) for p in ("/routing", "/health/deep")]
    wrong = await _as(gw, "llmgw-not-a-key").get("/routing")
    liveness = await anonymous.get("/health")

    for resp in (*refused, wrong):
        assert_openai_error(resp, 401)
        assert "premium" not in resp.text and "staff" not in resp.text
    assert liveness.status_code == 200
    assert await _seen(_as(gw, free)) == (["open"], [OPEN])
    assert await _seen(_as(gw, pro)) == (["open", "premium"], [OPEN, PREMIUM])
    assert await _seen(_as(gw, internal)) == (["open", "premium", "staff"], [OPEN, PREMIUM, STAFF])
    assert await _seen(_as(gw, ADMIN)) == (["open", "premium", "staff"], [OPEN, PREMIUM, STAFF])


async def test_routing_with_auth_off_hides_models_above_the_anonymous_role(
    gateway_factory: GatewayFactory,
    tmp_path: Path,
) -> None:
    gw = await gateway_factory(keys_config(tmp_path, *_models()))
    assert await _seen(_as(gw, None)) == (["open"], [OPEN])
    assert await _seen(_as(gw, ADMIN)) == (["open", "premium", "staff"], [OPEN, PREMIUM, STAFF])
    assert (await _as(gw, None).get("/metrics")).status_code == 200  # open gateway


async def test_metrics_with_auth_on_need_an_internal_or_admin_key(
    gateway_factory: GatewayFactory,
    tmp_path: Path,
) -> None:
    free, pro, internal = await create_keys(tmp_path, "free", "pro", "internal")
    gw = await gateway_factory(keys_config(tmp_path, *_models()))
    anonymous = await _as(gw, None).get("/metrics")
    lower = [await _as(gw, key).get("/metrics") for key in (free, pro)]
    allowed = [await _as(gw, key).get("/metrics") for key in (internal, ADMIN)]

    assert_openai_error(anonymous, 401)
    for resp in lower:
        assert_openai_error(resp, 403)
        assert "premium" not in resp.text
    for resp in allowed:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
        assert "llmgw_requests" in resp.text


async def test_metrics_public_serves_scrapers_without_credentials(
    gateway_factory: GatewayFactory,
    tmp_path: Path,
) -> None:
    await create_keys(tmp_path, "free")
    gw = await gateway_factory(keys_config(tmp_path, *_models(), metrics={"public": True}))
    scraped = await _as(gw, None).get("/metrics")
    routing = await _as(gw, None).get("/routing")

    assert scraped.status_code == 200 and "llmgw_requests" in scraped.text
    assert_openai_error(routing, 401)  # only /metrics is opened
