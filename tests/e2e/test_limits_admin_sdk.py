"""What an operator setting limits reads, through the real gateway: a spent budget names its
period in words, a limit on a key that does not exist is refused, and a limit value of the
wrong type is refused naming the field (HTTP admin API and ``llmgw admin``)."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Any

import openai
import pytest

from tests.e2e.conftest import HI, model, route
from tests.e2e.keys_support import ADMIN, admin_http, cli, keys_config
from tests.e2e.limits_support import call, new_key, set_limit
from tests.fixtures.gateway import REPO

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e

PRICING = {"prompt": 2.0, "completion": 10.0}  # USD per million tokens


async def _gateway(
    gateway_factory: GatewayFactory, up: FakeUpstream, tmp_path: Path
) -> RunningGateway:
    return await gateway_factory(keys_config(tmp_path, model("m", route(up, pricing=PRICING))))


@pytest.mark.parametrize(("period", "word"), [("day", "daily"), ("week", "weekly")])
async def test_a_budget_refusal_names_its_period_in_words_and_why(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    period: str,
    word: str,
) -> None:
    gw = await _gateway(gateway_factory, fake_upstream, tmp_path)
    key, _ = await new_key(gw, org="acme")
    # A request reserves about 70 micro-USD; the org may spend 50.
    await set_limit(gw, "org", "acme", budget=f"0.00005/{period}")

    with pytest.raises(openai.RateLimitError) as refused:
        await gw.openai(key).chat.completions.create(model="m", messages=HI, max_tokens=5)

    message = refused.value.body["message"]  # type: ignore[index]
    # Nothing is spent yet: the request's reservation alone does not fit, and it says so.
    assert f"more than the $5e-05 left of the {word} budget of $5e-05" in message, message
    assert "fewer tokens" in message and "is spent" not in message, message


async def test_a_limit_on_a_key_that_does_not_exist_is_refused(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    gw = await _gateway(gateway_factory, fake_upstream, tmp_path)
    _, key_id = await new_key(gw)
    http = admin_http(gw)

    missing = await http.put("/admin/limits/key/gk-000000000000", json={"rpm": 5})
    known = await http.put(f"/admin/limits/key/{key_id}", json={"rpm": 5})

    assert missing.status_code == 404, missing.text
    assert "gk-000000000000" in missing.json()["error"]["message"]
    assert known.status_code == 200, known.text
    assert (await http.get("/admin/limits")).json()["limits"] == {f"key:{key_id}": {"rpm": 5}}


@pytest.mark.parametrize(
    ("org", "user", "param"),
    [("Acme Corp", "ann", "org"), ("acme", "ann lee", "user"), ("acme/eu", "ann", "org")],
)
async def test_a_key_whose_org_or_user_no_limit_could_name_is_refused(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    org: str,
    user: str,
    param: str,
) -> None:
    """A key of organisation "Acme Corp" was made, and then no limit could be set on that
    organisation (a subject has no spaces); one of organisation "acme/eu", user "ann" shared
    the user limit and counters ``user:acme/eu/ann`` with user "eu/ann" of "acme"."""
    gw = await _gateway(gateway_factory, fake_upstream, tmp_path)
    http = admin_http(gw)

    made = await http.post("/admin/keys", json={"org": org, "user": user, "role": "pro"})
    argv = ("create", "--org", org, "--user", user, "--role", "pro")
    by_cli = await cli(tmp_path, *argv, check=False)

    assert made.status_code == 400, made.text
    assert made.json()["error"]["param"] == param, made.text
    assert by_cli is None
    assert (await http.get("/admin/keys")).json()["data"] == []


async def test_the_limit_of_a_key_that_does_not_exist_is_a_404(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    gw = await _gateway(gateway_factory, fake_upstream, tmp_path)
    _, key_id = await new_key(gw)
    http = admin_http(gw)

    missing = await http.get("/admin/limits/key/gk-000000000000")
    known = await http.get(f"/admin/limits/key/{key_id}")  # no limit, no use yet

    assert missing.status_code == 404, missing.text
    assert missing.json()["error"]["type"] == "not_found_error", missing.text
    assert "gk-000000000000" in missing.json()["error"]["message"]
    assert known.status_code == 200, known.text
    assert known.json()["limit"] is None
    assert known.json()["usage"]["requests_last_minute"] == 0


@pytest.mark.parametrize(("name", "value"), [("tpm", "abc"), ("rpm", 1.5), ("soft_fraction", "x")])
async def test_a_limit_value_of_the_wrong_type_is_refused_naming_the_field(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    name: str,
    value: Any,
) -> None:
    gw = await _gateway(gateway_factory, fake_upstream, tmp_path)
    over_http = await admin_http(gw).put(
        "/admin/limits/org/acme", json={"budget": "1/day", name: value}
    )
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "gateway.cli.main", "admin", "limits", "set"),
        *("--url", gw.url, "--admin-key", ADMIN, "--arg", "subject=org:acme"),
        *("--arg", f"{name}={value}"),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, raw_err = await asyncio.wait_for(proc.communicate(), 30)
    err = raw_err.decode()

    body: dict[str, Any] = over_http.json()["error"]
    assert over_http.status_code == 400 and body["param"] == name
    assert body["message"] == f"'{name}' must be " + body["message"].split(" must be ", 1)[1]
    assert repr(value) in body["message"]
    assert "Expected" not in body["message"] and "$." not in body["message"]
    assert proc.returncode == 1
    assert err.count("\n") == 1 and f"'{name}' must be" in err and repr(value) in err, err


HUGE = int("9" * 400)  # JSON has no bound on an integer
REQUESTS: dict[str, dict[str, Any]] = {
    "chat": {"model": "m", "messages": HI},
    "responses": {"model": "m", "input": "hi"},
    "messages": {"model": "m", "max_tokens": 5, "messages": HI},
}


@pytest.mark.parametrize(
    ("surface", "field"),
    [
        ("chat", "max_tokens"),
        ("chat", "max_completion_tokens"),
        ("responses", "max_output_tokens"),
        ("messages", "max_tokens"),
    ],
)
async def test_a_token_count_past_64_bits_is_400_naming_it_and_the_limits_hold(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    surface: str,
    field: str,
) -> None:
    # It reached the limits' owner, whose arithmetic overflowed: the actor crash-looped, a
    # 503 limits_unavailable for every limited caller while it restarted.
    gw = await _gateway(gateway_factory, fake_upstream, tmp_path)
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, tpm=1_000_000)

    # Raw: the anthropic SDK cannot send it (it derives a timeout from max_tokens).
    body = {**REQUESTS[surface], field: HUGE}
    refused = await gw.http().post(
        f"/v1/{surface}".replace("chat", "chat/completions"),
        json=body,
        headers={"authorization": f"Bearer {key}"},
    )
    served = await call(gw, surface, key)

    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]["message"]
    assert message.startswith(f"{field}: must be an integer that fits in 64 bits"), message
    assert served.status == 200, served.body
    assert len(fake_upstream.requests) == 1
