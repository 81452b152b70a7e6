"""The SDK calls beside inference: openai's ``models.retrieve`` (``GET /v1/models/{id}``) and
anthropic's ``messages.count_tokens`` (``POST /v1/messages/count_tokens``); errors anywhere
under ``/v1/messages/`` in Anthropic's shape; and an ``x-request-id`` on every error answer.
Runs on ``inproc://`` and on NATS."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anthropic
import openai
import pytest

from gateway.formats.openai_chat import estimate_prompt_tokens
from tests.e2e._surface_clients import error_body
from tests.e2e.conftest import CHAT, HI, assert_openai_error, chat, config, model, route
from tests.e2e.keys_support import create_keys, keys_config
from tests.fixtures.upstream import FakeUpstream, Reply

if TYPE_CHECKING:
    from pathlib import Path

    import httpx

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

MESSAGES = "/v1/messages"
ADMIN = "adm-count-key"


@pytest.fixture
async def gw(gateway_factory: GatewayFactory, fake_upstream: FakeUpstream) -> RunningGateway:
    """Models ``m`` (alias ``m-alias``) and ``org/m`` on one fake upstream, an admin key."""
    return await gateway_factory(
        config(
            model("m", route(fake_upstream), aliases=["m-alias"]),
            model("org/m", route(fake_upstream)),
            admin_key=ADMIN,
            server={"max_body_bytes": 4096},
        )
    )


def assert_anthropic_error(resp: httpx.Response, status: int, kind: str) -> str:
    """``resp`` is an Anthropic-shaped ``status`` error of ``kind``; returns its message."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == kind, body
    return str(body["error"]["message"])


# -- models.retrieve ------------------------------------------------------------------------


async def test_models_retrieve_answers_a_model_and_its_alias_and_404s_an_unknown_one(
    gw: RunningGateway,
) -> None:
    client = gw.openai()

    found = await client.models.retrieve("m")
    by_alias = await client.models.retrieve("m-alias")
    with_slash = await client.models.retrieve("org/m")
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.models.retrieve("nope")

    listed = (await client.models.list()).data[0]
    assert found == listed and found.id == "m" and found.object == "model"
    assert by_alias.id == "m" and with_slash.id == "org/m"
    err = assert_openai_error(unknown.value.response, 404, "route_not_found")
    assert "nope" in err["message"]


async def test_anthropic_sdk_lists_and_retrieves_models_in_its_own_shape(
    gw: RunningGateway,
) -> None:
    client = gw.anthropic()

    found = await client.models.retrieve("m-alias")
    listed = [m.id async for m in client.models.list()]

    assert found.id == "m" and found.type == "model" and found.display_name == "m"
    assert "m" in listed and "org/m" in listed


async def test_models_retrieve_of_a_model_hidden_by_role_reads_as_not_found(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    free_key, pro_key = await create_keys(tmp_path, "free", "pro")
    gw = await gateway_factory(
        keys_config(
            tmp_path,
            model("m", route(fake_upstream)),
            model("premium", route(fake_upstream), required_role="pro"),
        )
    )
    free = gw.openai(free_key)

    with pytest.raises(openai.NotFoundError) as hidden:
        await free.models.retrieve("premium")
    with pytest.raises(openai.NotFoundError) as unknown:
        await free.models.retrieve("absent")
    seen = await gw.openai(pro_key).models.retrieve("premium")

    # Word for word the answer for a model that does not exist: nothing is revealed.
    assert str(hidden.value).replace("premium", "X") == str(unknown.value).replace("absent", "X")
    assert seen.id == "premium"


async def test_anthropic_sdk_models_errors_are_in_its_own_shape(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    (key,) = await create_keys(tmp_path, "free")
    gw = await gateway_factory(keys_config(tmp_path, model("m", route(fake_upstream))))

    with pytest.raises(anthropic.NotFoundError) as unknown:
        await gw.anthropic(key).models.retrieve("zz")
    with pytest.raises(anthropic.AuthenticationError) as wrong_key:
        await gw.anthropic("llmgw-wrong").models.list()
    openai_caller = await gw.http().get("/v1/models/zz", headers={"authorization": f"Bearer {key}"})

    for caught, kind in ((unknown, "not_found_error"), (wrong_key, "authentication_error")):
        body = error_body(caught.value)
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        assert body["error"]["type"] == kind, body
    assert "zz" in error_body(unknown.value)["error"]["message"]
    assert_openai_error(openai_caller, 404, "route_not_found")


# -- messages.count_tokens ------------------------------------------------------------------


async def test_count_tokens_answers_the_gateways_own_estimate_without_an_upstream_call(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
) -> None:
    sent: list[bytes] = []

    async def record(request: httpx.Request) -> None:
        sent.append(request.content)

    client = gw.anthropic(
        http_client=anthropic.DefaultAsyncHttpxClient(event_hooks={"request": [record]})
    )
    counted = await client.messages.count_tokens(
        model="m", system="Be brief.", messages=[{"role": "user", "content": "hi " * 200}]
    )

    [body] = sent
    assert counted.input_tokens == estimate_prompt_tokens(len(body)) > 100
    assert fake_upstream.requests == []


async def test_count_tokens_refusals_are_anthropic_shaped(gw: RunningGateway) -> None:
    client = gw.anthropic()

    with pytest.raises(anthropic.NotFoundError) as unknown:
        await client.messages.count_tokens(model="nope", messages=HI)
    with pytest.raises(anthropic.BadRequestError) as system_role:
        await client.messages.count_tokens(
            model="m", messages=[{"role": "system", "content": "x"}, *HI]
        )

    assert error_body(unknown.value)["error"]["type"] == "not_found_error"
    assert "nope" in error_body(unknown.value)["error"]["message"]
    assert error_body(system_role.value)["error"]["message"].startswith("messages[0].role")


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/v1/messages/batches", 404),
        ("GET", "/v1/messages/count_tokens", 405),
        ("POST", "/v1/messages/", 404),
    ],
)
async def test_errors_under_v1_messages_are_anthropic_shaped(
    gw: RunningGateway,
    method: str,
    path: str,
    status: int,
) -> None:
    resp = await gw.http().request(method, path, json={})

    kind = "not_found_error" if status == 404 else "invalid_request_error"
    assert_anthropic_error(resp, status, kind)
    assert resp.headers["x-request-id"]


# -- x-request-id on every error answer -----------------------------------------------------


async def test_every_error_answer_carries_an_x_request_id_that_the_request_log_knows(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
) -> None:
    fake_upstream.enqueue(Reply(503))
    http = gw.http()
    errors: dict[str, httpx.Response] = {
        "unknown path": await http.get("/v1/nothing"),
        "wrong method": await http.get(CHAT),
        "not json": await http.post(CHAT, content=b"{", headers={"content-type": "x"}),
        "too large": await http.post(CHAT, json=chat("m", user="u" * 5000)),
        "unknown model": await http.post(CHAT, json=chat("nope")),
        "upstream failed": await http.post(CHAT, json=chat("m")),
        "messages bad field": await http.post(
            MESSAGES, json={"model": "m", "max_tokens": "5", "messages": HI}
        ),
        "admin without key": await http.post("/admin/log/stats"),
        "model lookup": await http.get("/v1/models/nope"),
    }

    ids = {name: resp.headers.get("x-request-id") for name, resp in errors.items()}
    assert all(resp.status_code >= 400 for resp in errors.values())
    assert all(ids.values()), ids
    assert len(set(ids.values())) == len(ids)
    query: dict[str, Any] = {"request_id": ids["not json"], "kind": "request"}
    rows = (
        await http.post(
            "/admin/log/query", json=query, headers={"authorization": f"Bearer {ADMIN}"}
        )
    ).json()["rows"]
    [row] = rows
    assert (row["status"], row["error_kind"]) == (400, "invalid_request")


async def test_two_ingresses_of_one_process_id_never_share_a_request_id(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # Ids were the process id and a count: ingresses in containers are all pid 1 (and the
    # two gateways here share this test's), so both answered 1-1, 1-2, ...; the limits'
    # owner keys its leases and settles by request id, and leaked a concurrency slot.
    first = await gateway_factory(config(model("m", route(fake_upstream))))
    second = await gateway_factory(config(model("m", route(fake_upstream))))
    ids = [
        (await gw.http().post(CHAT, json=chat("m"))).headers["x-request-id"]
        for gw in (first, second, first, second)
    ]
    assert len(set(ids)) == 4, ids
