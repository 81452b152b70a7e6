"""What the telemetry tests trace: a gateway config with one echo route, its candidate and
target, and a chat request's trace made the way the ingress makes it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.adapters.base import UpstreamTarget
from gateway.http.request import HttpRequest
from gateway.telemetry import start_telemetry
from schemas import RouteCandidate
from schemas.config import GatewayConfig

if TYPE_CHECKING:
    from gateway.telemetry.provider import Telemetry
    from gateway.telemetry.request_trace import RequestTrace

CANDIDATE = RouteCandidate(
    endpoint="m#0", kind="echo", base_url="http://e:81/v1", upstream_model="m"
)
TARGET = UpstreamTarget(
    endpoint="m#0",
    kind="echo",
    base_url="http://e:81/v1",
    upstream_model="m",
    api_key=None,
    timeout=1,
    connect_timeout=1,
)


def echo_telemetry(**settings: Any) -> Telemetry:
    """The process telemetry of a config with model ``m`` on one echo route, ``settings``
    added to its ``telemetry`` section (enabled, OTLP metrics off)."""
    config = GatewayConfig.model_validate(
        {
            "telemetry": {"enabled": True, "metrics": False, **settings},
            "models": [{"id": "m", "route": [{"kind": "echo", "base_url": "http://e:81/v1"}]}],
        }
    )
    telemetry = start_telemetry(config)
    assert telemetry is not None
    return telemetry


def chat_request(
    telemetry: Telemetry,
    request_id: str = "r-1",
    headers: list[tuple[bytes, bytes]] | None = None,
    route: str = "/v1/chat/completions",
) -> RequestTrace:
    """A chat request's trace (its body and answer never touched)."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": headers or [],
    }
    req = HttpRequest(scope, _never_receive, _never_send, request_id=request_id)
    return telemetry.request(req, route)


async def _never_receive() -> Any:
    raise AssertionError("the trace never reads the body")


async def _never_send(message: Any) -> None:
    raise AssertionError("the trace never answers")
