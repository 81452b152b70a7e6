"""What the tests of upstreams' misshapen answers share: a request on each client surface,
its whole answer read raw (a torn connection fails the test), and how each surface's stream
ends, cleanly or in its dialect's error."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tests.e2e.conftest import HI, config, model

if TYPE_CHECKING:
    import pytest

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

ADMIN = "adm-bad-answers"
TINY = 1e-6  # a fallback's weight: the draw picks the primary first
SSE = {"content-type": "text/event-stream"}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def surface_request(surface: str, stream: bool) -> dict[str, Any]:
    """A request for model ``m`` in ``surface``'s shape."""
    if surface == "chat":
        return {"model": "m", "messages": HI, "stream": stream}
    if surface == "responses":
        return {"model": "m", "input": "hi", "stream": stream}
    return {"model": "m", "max_tokens": 16, "messages": HI, "stream": stream}


async def start_gateway(gateway_factory: GatewayFactory, *routes: dict[str, Any]) -> RunningGateway:
    """A gateway serving model ``m`` over ``routes``, in order."""
    return await gateway_factory(config(model("m", *routes), admin_key=ADMIN))


async def post(gw: RunningGateway, surface: str, stream: bool) -> tuple[int, str]:
    """Status and whole body of one request; a torn connection fails the test."""
    async with (
        gw.http() as client,
        client.stream("POST", PATHS[surface], json=surface_request(surface, stream)) as resp,
    ):
        return resp.status_code, (await resp.aread()).decode()


def ended_cleanly(surface: str, body: str) -> bool:
    """Whether a stream in ``surface``'s dialect ended as a finished answer."""
    end = {"chat": "data: [DONE]", "responses": "response.completed", "messages": "message_stop"}
    return end[surface] in body and not ended_in_error(surface, body.replace(end[surface], ""))


def ended_in_error(surface: str, body: str) -> bool:
    """Whether a stream in ``surface``'s dialect ended in its stream error."""
    if surface == "chat":
        return '"error"' in body and "[DONE]" not in body
    if surface == "responses":
        return "response.failed" in body and "response.completed" not in body
    return "event: error" in body and "event: message_stop" not in body


def is_bad_response(surface: str, status: int, body: str) -> bool:
    """Whether a whole answer is the upstream's bad response: a 502 in ``surface``'s shape."""
    messages_shaped = '"type":"error"' in body
    return (
        status == 502 and "invalid response" in body and messages_shaped == (surface == "messages")
    )


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """Fails when anything was logged with a traceback (an unhandled error's 500)."""
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
