"""Running the real gateway process with telemetry on, exporting to a test's OTLP receiver."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import yaml

from tests.e2e.conftest import WAIT
from tests.e2e.keys_support import db_path
from tests.fixtures.gateway import GatewayProcess

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.otlp import OtlpReceiver, SpanView

GATEWAY_KEY = "gwk-canary-7f3e9a0b2c"
UPSTREAM_KEY = "sk-upstream-canary-51d2e8"
PROMPT = "prompt-canary-c4f1 what is the capital of France?"
COMPLETION = "completion-canary-9b7a Paris."
CANARIES = (GATEWAY_KEY, UPSTREAM_KEY, "prompt-canary-c4f1", "completion-canary-9b7a")


def otel_env(receiver: OtlpReceiver) -> dict[str, str]:
    """The standard variables pointing the SDK at ``receiver``, with short schedules and the
    latest GenAI conventions (the names the telemetry tests check)."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "",
        "OTEL_BSP_SCHEDULE_DELAY": "20",
        "OTEL_METRIC_EXPORT_INTERVAL": "100",
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
    }


async def start_traced(
    processes: list[GatewayProcess],
    tmp_path: Path,
    receiver: OtlpReceiver,
    config: dict[str, Any],
    telemetry: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> GatewayProcess:
    """``llmgw serve`` with ``config`` plus ``telemetry: {enabled: true, ...}`` (``env``: over
    :func:`otel_env`'s variables)."""
    full = {
        **config,
        "database": {"path": db_path(tmp_path)},
        "telemetry": {"enabled": True, **(telemetry or {})},
    }
    path = tmp_path / "llmgw.yaml"
    path.write_text(yaml.safe_dump(full))
    gw = GatewayProcess(
        ["serve", "--config", str(path), "--port", "0"], env={**otel_env(receiver), **(env or {})}
    )
    processes.append(gw)
    await asyncio.to_thread(gw.start)
    return gw


def _request_spans(request_id: str, count: int) -> Any:
    def found(r: OtlpReceiver) -> list[SpanView] | None:
        server = next(
            (
                s
                for s in r.spans
                if s.kind == "SERVER" and s.attributes.get("llmgw.request_id") == request_id
            ),
            None,
        )
        if server is None:
            return None
        spans = r.trace(server.trace_id)
        return spans if len(spans) >= count else None

    return found


async def request_trace(receiver: OtlpReceiver, request_id: str, count: int) -> list[SpanView]:
    """The spans of the trace whose SERVER span served ``request_id``, once ``count`` arrived."""
    spans: list[SpanView] = await receiver.wait_for(_request_spans(request_id, count), WAIT)
    return spans


def one(spans: list[SpanView], kind: str, name: str | None = None) -> SpanView:
    """The single span of ``kind`` (and ``name``)."""
    found = [s for s in spans if s.kind == kind and (name is None or s.name == name)]
    assert len(found) == 1, [(s.kind, s.name) for s in spans]
    return found[0]
