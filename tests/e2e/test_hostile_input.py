"""What the ingress accepts from a hostile or careless client, on every surface: JSON nested
past the stack, megabyte model names and headers, documented fields of the wrong type. Each
is refused (or bounded) in the caller's own shape, never a 500 or a traceback, and nothing
reaches the upstream. Runs on ``inproc://`` and on NATS."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import openai
import pytest

from schemas import RequestCompleted, subjects
from tests.e2e._surface_clients import error_body
from tests.e2e.conftest import (
    CHAT,
    HALF_OPEN_SOON,
    HI,
    anthropic_route,
    assert_openai_error,
    chat,
    circuit_events,
    config,
    model,
    route,
    watch,
)
from tests.fixtures.upstream import FakeUpstream, Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

ADMIN = "adm-input-key"
RESPONSES, MESSAGES, EMBEDDINGS = "/v1/responses", "/v1/messages", "/v1/embeddings"
# A valid request per surface; a test adds one field to it.
BASE: dict[str, dict[str, Any]] = {
    CHAT: chat("m"),
    RESPONSES: {"model": "m", "input": "hi"},
    MESSAGES: {"model": "m", "max_tokens": 5, "messages": HI},
    EMBEDDINGS: {"model": "m", "input": "hi"},
}


@pytest.fixture
async def gw(gateway_factory: GatewayFactory, fake_upstream: FakeUpstream) -> RunningGateway:
    """Model ``m`` on one fake upstream; the admin key reads the request log."""
    return await gateway_factory(config(model("m", route(fake_upstream)), admin_key=ADMIN))


def assert_refused(path: str, resp: httpx.Response, status: int = 400) -> str:
    """``resp`` is a ``status`` refusal in ``path``'s API shape; returns its message."""
    if path == MESSAGES:
        assert resp.status_code == status, resp.text
        body = resp.json()
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        return str(body["error"]["message"])
    err = assert_openai_error(resp, status, "invalid_request")
    return str(err["message"])


def nested(path: str, depth: int) -> bytes:
    """``path``'s valid request with one extra field holding arrays nested ``depth`` deep."""
    head = httpx.Request("POST", "/", json=BASE[path]).content[:-1]
    return head + b', "x": ' + b"[" * depth + b"]" * depth + b"}"


# -- item: JSON nested past the stack -------------------------------------------------------


@pytest.mark.parametrize("path", list(BASE))
@pytest.mark.parametrize("depth", [1_000, 5_000, 100_000])
async def test_json_nested_past_the_stack_is_400_in_the_surface_shape_without_a_traceback(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
    path: str,
    depth: int,
) -> None:
    caplog.set_level(logging.WARNING)

    resp = await gw.http().post(
        path, content=nested(path, depth), headers={"content-type": "application/json"}
    )

    assert "nested too deeply" in assert_refused(path, resp)
    assert resp.headers["x-request-id"]
    assert fake_upstream.requests == []
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


async def test_json_nested_just_short_of_the_decode_limit_is_never_a_500(
    gw: RunningGateway,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Deep enough to decode yet too deep to encode again for the upstream, one stack level
    # further down: the depths around the limit are either served or refused 400.
    caplog.set_level(logging.WARNING)
    http = gw.http()

    statuses = {}
    for depth in range(930, 1001):
        resp = await http.post(
            CHAT, content=nested(CHAT, depth), headers={"content-type": "application/json"}
        )
        statuses[depth] = resp.status_code
        if resp.status_code != 200:
            assert "nested too deeply" in assert_refused(CHAT, resp)

    assert set(statuses.values()) == {200, 400}, statuses
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


async def _deepest_decoded(http: httpx.AsyncClient, low: int, high: int) -> int:
    """The deepest nesting in ``[low, high)`` the ingress still decodes: a request for an
    unknown model is 404 if its body decoded, 400 if not (nothing is encoded after it)."""
    while high - low > 1:
        mid = (low + high) // 2
        body = nested(CHAT, mid).replace(b'"m"', b'"nope"', 1)
        resp = await http.post(CHAT, content=body, headers={"content-type": "application/json"})
        if resp.status_code == 404:
            low = mid
        else:
            assert "nested too deeply" in assert_refused(CHAT, resp)
            high = mid
    return low


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
async def test_a_body_too_deep_to_encode_for_the_upstream_gives_back_the_probe_it_took(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, stream: bool
) -> None:
    # Decoded, then refused while encoded for the upstream: the attempt has already leased
    # the half-open probe, which must be given back (or the endpoint stays half-open, its
    # probe "in flight", refusing everyone until the probe's deadline).
    # A cooldown long enough for a loaded machine to act between the transitions: a half-open
    # circuit whose probe no request takes within one is probed in the background.
    circuit = {**HALF_OPEN_SOON, "cooldown_seconds": 3.0}
    gw = await gateway_factory(config(model("m", route(fake_upstream)), circuit=circuit))
    http = gw.http()
    depth = await _deepest_decoded(http, 500, 5000)
    body = nested(CHAT, depth)
    if stream:
        body = body.replace(b'"model"', b'"stream": true, "model"', 1)
    fake_upstream.enqueue(Reply(500), Reply(500))

    async with circuit_events(gw) as events:
        await http.post(CHAT, json=chat("m"))
        await http.post(CHAT, json=chat("m"))
        await events.circuit("open")
        await events.circuit("half_open")
        resp = await http.post(CHAT, content=body, headers={"content-type": "application/json"})
        assert "nested too deeply" in assert_refused(CHAT, resp)
        reopened = await events.circuit("open")
        await events.circuit("half_open")
        probe = await http.post(CHAT, json=chat("m"))
        if probe.status_code == 503:
            # Later than a cooldown after half-opening (a loaded machine): the route's own
            # background probe took the lease first, and its answer closes the circuit.
            await events.circuit("closed")
            probe = await http.post(CHAT, json=chat("m"))

    assert "abandoned" in reopened.reason
    assert probe.status_code == 200, probe.text


# -- item: client-chosen strings that are stored are bounded ---------------------------------


async def test_a_megabyte_model_name_is_404_and_stored_and_echoed_bounded(
    gw: RunningGateway,
) -> None:
    name = "x" * 1_000_000
    with pytest.raises(openai.NotFoundError) as exc:
        await gw.openai().chat.completions.create(model=name, messages=HI)
    resp = exc.value.response
    rid = resp.headers["x-request-id"]
    rows = (
        await gw.http().post(
            "/admin/log/query",
            json={"request_id": rid, "kind": "request"},
            headers={"authorization": f"Bearer {ADMIN}"},
        )
    ).json()["rows"]

    err = assert_openai_error(resp, 404, "route_not_found")
    assert len(resp.content) < 1_000 and err["message"].count("x") < 300
    [row] = rows
    assert row["requested_model"] == "x" * 255 + "…"


async def test_a_long_inference_grant_is_cut_in_the_callers_affinity_key(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
) -> None:
    grant = "g" * 10_000  # what the HTTP server lets through of one header
    async with watch(gw, subjects.request_done("m")) as done:
        resp = await gw.http().post(CHAT, json=chat("m"), headers={"x-inference-grant": grant})
        completed = await done.next(RequestCompleted)

    assert resp.status_code == 200, resp.text
    assert completed.caller == "grant:" + "g" * 128


# -- item: documented fields of the wrong type ----------------------------------------------


async def test_sdks_sending_a_mistyped_documented_field_get_a_400_naming_it(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
) -> None:
    oai, claude = gw.openai(), gw.anthropic()
    params: dict[str, Any] = {}
    messages: dict[str, str] = {}
    calls: dict[str, Any] = {
        "chat temperature": oai.chat.completions.create(model="m", messages=HI, temperature="hot"),
        "chat n": oai.chat.completions.create(model="m", messages=HI, n=1.5),
        "chat stop": oai.chat.completions.create(model="m", messages=HI, stop=7),
        "chat message content": oai.chat.completions.create(
            model="m", messages=[{"role": "user", "content": 5}]
        ),
        "responses temperature": oai.responses.create(model="m", input="hi", temperature="hot"),
        "responses store": oai.responses.create(model="m", input="hi", store="yes"),
        "embeddings dimensions": oai.embeddings.create(model="m", input="hi", dimensions="big"),
        "messages metadata": claude.messages.create(
            model="m", max_tokens=5, messages=HI, metadata="me"
        ),
        "messages temperature": claude.messages.create(
            model="m", max_tokens=5, messages=HI, extra_body={"temperature": "hot"}
        ),
        "messages system role": claude.messages.create(
            model="m", max_tokens=5, messages=[{"role": "system", "content": "Be brief."}, *HI]
        ),
    }
    for name, call in calls.items():
        with pytest.raises((openai.BadRequestError, anthropic.BadRequestError)) as exc:
            await call
        refused = exc.value
        assert isinstance(refused, openai.BadRequestError | anthropic.BadRequestError)
        body = error_body(refused)
        if isinstance(refused, anthropic.BadRequestError):
            # Anthropic's error shape has no param: the message names the field.
            assert set(body["error"]) == {"type", "message"}, body
            body = body["error"]
        params[name], messages[name] = body.get("param"), body["message"]

    assert params == {
        "chat temperature": "temperature",
        "chat n": "n",
        "chat stop": "stop",
        "chat message content": "messages[0].content",
        "responses temperature": "temperature",
        "responses store": "store",
        "embeddings dimensions": "dimensions",
        "messages metadata": None,
        "messages temperature": None,
        "messages system role": None,
    }
    assert messages["chat temperature"] == "temperature: must be a number"
    assert messages["messages metadata"].startswith("metadata: must be an object")
    assert messages["messages temperature"].startswith("temperature: must be a number")
    assert messages["messages system role"].startswith("messages[0].role:")
    assert "system" in messages["messages system role"]
    assert fake_upstream.requests == []


# What the translating adapters read inside documented chat fields: each item mistyped.
_TOOL = {"type": "function", "function": {"name": "f"}}
MISTYPED_ITEMS: dict[str, tuple[dict[str, Any], str]] = {
    "tools item": ({"tools": ["x"]}, "tools[0]"),
    "tools function": ({"tools": [{"type": "function", "function": "x"}]}, "tools[0].function"),
    "tools parameters": (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
        "tools[0].function.parameters",
    ),
    "tool_choice function": (
        {"tools": [_TOOL], "tool_choice": {"type": "function", "function": "f"}},
        "tool_choice.function",
    ),
    "allowed tools item": (
        {
            "tools": [_TOOL],
            "tool_choice": {"type": "allowed_tools", "allowed_tools": {"tools": ["f"]}},
        },
        "tool_choice.allowed_tools.tools[0]",
    ),
    "response_format schema": (
        {"response_format": {"type": "json_schema", "json_schema": "x"}},
        "response_format.json_schema",
    ),
    "content part": ({"messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content[0]"),
    "tool call arguments": (
        {
            "messages": [
                *HI,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": 5}}
                    ],
                },
            ]
        },
        "messages[1].tool_calls[0].function.arguments",
    ),
}


@pytest.mark.parametrize("case", list(MISTYPED_ITEMS))
async def test_a_mistyped_item_of_a_documented_chat_field_is_400_naming_it_on_every_route(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
    case: str,
) -> None:
    # An anthropic route translates the request: a tool_choice whose function was a string
    # failed there with a 500 (AttributeError), an openai_compat one forwarded it upstream.
    gw = await gateway_factory(
        config(model("m", route(fake_upstream)), model("c", anthropic_route(fake_upstream)))
    )
    extra, param = MISTYPED_ITEMS[case]

    for model_id in ("m", "c"):
        resp = await gw.http().post(CHAT, json={**chat(model_id), **extra})
        err = assert_openai_error(resp, 400, "invalid_request")
        assert err["param"] == param, (model_id, err)
    assert fake_upstream.requests == []
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize(
    ("inputs", "param"),
    [
        (["a", 5, None], "input[1]"),
        ([5, "a"], "input[1]"),
        ([[1], "x"], "input[1]"),
        ([None], "input[0]"),
    ],
)
async def test_an_embeddings_input_array_of_mixed_kinds_is_400_naming_the_item(
    gw: RunningGateway, fake_upstream: FakeUpstream, inputs: list[Any], param: str
) -> None:
    resp = await gw.http().post(EMBEDDINGS, json={"model": "m", "input": inputs})

    assert assert_openai_error(resp, 400, "invalid_request")["param"] == param
    assert fake_upstream.requests == []


async def test_an_embeddings_input_openai_refuses_is_400_from_the_sdk_and_never_upstream(
    gw: RunningGateway, fake_upstream: FakeUpstream
) -> None:
    # An empty text reached the upstream, which billed it or answered in its own way;
    # OpenAI refuses it (and the rest here) with a 400 naming the input.
    refused: dict[str, Any] = {}
    inputs: list[Any] = ["", [""], [[]], [[1, 2.5]], ["a"] * 2049]
    for inp in inputs:
        with pytest.raises(openai.BadRequestError) as exc:
            await gw.openai().embeddings.create(model="m", input=inp)
        refused[str(inp)[:12]] = (exc.value.status_code, error_body(exc.value).get("param"))

    assert refused == {
        "": (400, "input"),
        "['']": (400, "input[0]"),
        "[[]]": (400, "input[0]"),
        "[[1, 2.5]]": (400, "input[0]"),
        "['a', 'a', '": (400, "input"),
    }
    assert fake_upstream.requests == []


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": "x"}}, "thinking.budget_tokens"),
        ({"tool_choice": {"type": "zzz"}}, "tool_choice.type"),  # with no tools, too
        ({"tool_choice": {"type": "auto", "disable_parallel_tool_use": "y"}}, "tool_choice."),
    ],
)
async def test_a_messages_request_with_a_mistyped_nested_field_is_400_naming_it(
    gw: RunningGateway, fake_upstream: FakeUpstream, extra: dict[str, Any], field: str
) -> None:
    resp = await gw.http().post(MESSAGES, json={**BASE[MESSAGES], **extra})

    assert assert_refused(MESSAGES, resp).startswith(field)
    assert fake_upstream.requests == []


async def test_a_request_an_anthropic_route_refuses_after_translation_names_the_callers_field(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # Both named chat's fields (messages[2].tool_calls[0].function.arguments and
    # messages[2].content[2].image_url.url), which the callers never sent.
    images = anthropic_route(fake_upstream, input_modalities=["text", "image"])
    gw = await gateway_factory(config(model("c", images)))
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{oops"}
    answer = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    image = {"type": "image", "source": {"type": "url", "url": "ftp://example.com/cat.png"}}

    with pytest.raises(openai.BadRequestError) as responses:
        await gw.openai().responses.create(
            model="c", instructions="be brief", input=[HI[0], call, answer]
        )
    with pytest.raises(anthropic.BadRequestError) as messages:
        await gw.anthropic().messages.create(
            model="c",
            max_tokens=5,
            messages=[
                HI[0],
                {"role": "assistant", "content": [use]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                        {"type": "text", "text": "and this"},
                        image,
                    ],
                },
            ],
        )

    err = error_body(responses.value)  # the SDK keeps the "error" object
    assert err["param"] == "input[1].arguments"
    assert err["message"].startswith("input[1].arguments: ")
    refusal = error_body(messages.value)["error"]["message"]
    assert refusal.startswith("messages[2].content[2].source: "), refusal
    assert fake_upstream.requests == []


async def test_unknown_extra_fields_still_pass_through_to_the_upstream(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
) -> None:
    extension = {"vendor_knob": {"level": 3}, "temperature": 0.2, "top_k": 4}

    answer = await gw.openai().chat.completions.create(model="m", messages=HI, extra_body=extension)

    assert answer.choices[0].message.content
    [sent] = fake_upstream.requests
    assert {k: sent.json[k] for k in extension} == extension
