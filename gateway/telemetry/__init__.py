"""OpenTelemetry for the ingress: one trace per request, GenAI conventions, OTLP export.

Owns the process's tracer and meter providers (:class:`~gateway.telemetry.provider.Telemetry`)
and the per-request span bookkeeping (:class:`~gateway.telemetry.request_trace.RequestTrace`).
The SDK is an optional extra (``llmgw[telemetry]``): nothing here imports it until
:func:`start_telemetry` is called with ``telemetry.enabled``, so a gateway with telemetry off
never loads an ``opentelemetry`` module and pays one ``is None`` test per hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.telemetry.provider import Telemetry
    from schemas.config import GatewayConfig

__all__ = ["start_telemetry"]


def start_telemetry(config: GatewayConfig) -> Telemetry | None:
    """The process's telemetry when ``config.telemetry.enabled``, else None. Raises
    RuntimeError when it is enabled but the ``telemetry`` extra is not installed."""
    if not config.telemetry.enabled:
        return None
    try:
        from gateway.telemetry.provider import Telemetry
    except ImportError as exc:
        raise RuntimeError(
            "telemetry.enabled needs the OpenTelemetry SDK: pip install 'llmgw[telemetry]'"
        ) from exc
    return Telemetry(config)
