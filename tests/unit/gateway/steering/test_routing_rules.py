"""The ingress's rule view: params derived from each surface's decoded request, the view
filled from the RulesActor's get, and the one call target resolution makes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from actors import ChildSpec, Supervisor
from actors.rules import RulesActor
from bus import InProcessBus
from gateway.admin.http import admin_request
from gateway.formats import anthropic_messages, openai_responses
from gateway.steering.rules import RulesView, request_params
from schemas import Rule, RulesState

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

TOOLS = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def test_params_of_a_chat_request() -> None:
    body = {
        "model": "auto",
        "stream": True,
        "tools": [TOOLS],
        "max_completion_tokens": 50,
        "temperature": 0,
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": ["hi", IMAGE]},
        ],
    }

    assert request_params("chat", body, 321, "user") == {
        "surface": "chat",
        "stream": True,
        "prompt_tokens": 321,
        "has_tools": True,
        "has_images": True,
        "modalities": ("text", "image"),
        "message_count": 2,
        "role": "user",
        "max_tokens": 50,
        "temperature": 0,
    }


def test_params_of_a_messages_request_read_its_canonical_form() -> None:
    body = anthropic_messages.to_chat_request(
        {
            "model": "auto",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        }
    )

    params = request_params("messages", body, 10, "free")

    assert params["has_tools"] is True and params["max_tokens"] == 64
    assert params["has_images"] is False and params["modalities"] == ("text",)
    assert "temperature" not in params and params["stream"] is False


def test_params_of_responses_and_embeddings_requests() -> None:
    responses = openai_responses.to_chat_request(
        {"model": "auto", "input": "hi", "max_output_tokens": 32}
    )
    embeddings = request_params("embeddings", {"model": "auto", "input": ["a", "b"]}, 0, "user")

    assert request_params("responses", responses, 5, "user")["max_tokens"] == 32
    assert embeddings["message_count"] == 0 and embeddings["has_tools"] is False
    assert "max_tokens" not in embeddings


@pytest.fixture
async def bus() -> AsyncIterator[InProcessBus]:
    b = InProcessBus()
    yield b
    await b.aclose()


async def test_a_view_started_before_the_owner_knows_no_rule(bus: InProcessBus) -> None:
    view = RulesView(bus)
    await view.start()
    try:
        assert view.health() == {"status": "unknown", "rules": 0}
        assert view.route_for({"has_tools": True}, {}) is None
    finally:
        await view.aclose()


async def test_a_view_started_after_the_owner_gets_the_set_and_resolves_locally(
    bus: InProcessBus,
) -> None:
    root = Supervisor("test", children=[ChildSpec("rules", RulesActor)])
    await root.start(bus)
    view = RulesView(bus)
    try:
        await admin_request(
            bus,
            "rules",
            "put",
            {
                "rules": [
                    {"name": "tools", "when": {"params.has_tools": True}, "route": "auto:Coding"},
                    {"name": "team", "when": {"metadata.team": "search"}, "route": "auto:search"},
                ]
            },
            by="test",
            timeout=5,
        )
        await view.start()
        params = request_params("chat", {"tools": [TOOLS], "messages": []}, 0, "user")
        first = view.route_for(params, {"team": "search"})
        foreign = view.route_for(params, {"team": "search"}, usable=lambda r: r != "auto:coding")
        nothing = view.route_for(params, {}, usable=lambda r: r != "auto:coding")
    finally:
        await view.aclose()
        await root.stop()

    assert view.health() == {"status": "ok", "rules": 2, "version": 1}
    assert first is not None and (first.name, first.route) == ("tools", "auto:coding")
    assert foreign is not None and foreign.name == "team"
    assert nothing is None


def test_a_published_state_that_does_not_compile_reads_as_disabled() -> None:
    view = RulesView(InProcessBus())
    bad = Rule(name="x", when={"params.nope": 1}, route="auto:a")

    view.apply(RulesState(rules=(bad,), version=3))

    assert view.health()["status"] == "disabled" and view.route_for({}, {}) is None
    assert "rules[0].when.params.nope" in view.health()["reason"]
