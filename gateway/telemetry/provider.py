"""The process's OpenTelemetry providers: traces and GenAI metrics over OTLP/HTTP.

Imported only when ``telemetry.enabled`` (see :func:`gateway.telemetry.start_telemetry`). The
SDK reads the standard ``OTEL_*`` variables itself: ``OTEL_EXPORTER_OTLP_ENDPOINT`` and
``..._HEADERS``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME`` (over
``telemetry.service_name``), ``OTEL_TRACES_SAMPLER``/``_ARG`` (unless ``sampler_ratio`` is
set), ``OTEL_BSP_*`` (the span batcher's schedule, as the SDK's batch processor reads them) and
``OTEL_METRIC_EXPORT_INTERVAL`` (over ``metrics_interval_seconds``),
``OTEL_SEMCONV_STABILITY_OPT_IN`` (gateway.telemetry.semconv) and
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (over ``capture_content``).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.telemetry.genai_metrics import GenAIInstruments
from gateway.telemetry.otlp_wire import WireSpanExporter
from gateway.telemetry.recorded_span import SpanRecorder
from gateway.telemetry.request_trace import RequestTrace
from gateway.telemetry.semconv import Semconv, capture_content
from gateway.telemetry.span_batcher import SpanBatcher

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from gateway.http.request import HttpRequest
    from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)

_MAX_SERVERS = 1024  # (address, port) per base URL; base URLs come from the config


class Telemetry:
    """Owns one TracerProvider (its sampler, ids and resource; SpanBatcher -> OTLP/HTTP)
    and the GenAI metrics (periodic OTLP/HTTP export); hands each request a RequestTrace."""

    def __init__(self, config: GatewayConfig) -> None:
        settings = config.telemetry
        attributes = (
            {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: settings.service_name}
        )
        resource = Resource.create(attributes)
        sampler = (
            ParentBased(TraceIdRatioBased(settings.sampler_ratio))
            if settings.sampler_ratio is not None
            else None  # the SDK reads OTEL_TRACES_SAMPLER (default: parent-based, always on)
        )
        self._tracer_provider = TracerProvider(resource=resource, sampler=sampler)
        processor = SpanBatcher(WireSpanExporter())
        self._tracer_provider.add_span_processor(processor)  # its shutdown flushes the batch
        self.spans = SpanRecorder(self._tracer_provider, processor, InstrumentationScope("llmgw"))
        self.propagator = TraceContextTextMapPropagator()
        self.semconv = Semconv.from_env()
        self.capture_content = capture_content(settings.capture_content)
        self.capture_max_chars = settings.capture_max_chars
        self._servers: dict[str, tuple[str, int | None]] = {}
        self.server_shapes: dict[tuple[Any, ...], tuple[str, dict[str, Any]]] = {}
        """A SERVER span's name and first attributes by method, route, scheme and server."""
        self.routing_shapes: dict[tuple[Any, ...], dict[str, Any]] = {}
        """A routing span's attributes once answered, by model and decision (owned by the
        RequestTraces, bounded there)."""
        self.attempt_shapes: dict[tuple[Any, ...], tuple[str, dict[str, Any]]] = {}
        """An attempt span's name and first attributes by candidate, surface, stream and hop
        (each request's attempts copy them; owned by the RequestTraces, bounded there)."""
        self.metrics: GenAIInstruments | None = None
        if settings.metrics:
            interval_ms = os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
            interval = (
                int(interval_ms) / 1000
                if interval_ms.isdigit() and int(interval_ms) > 0
                else settings.metrics_interval_seconds
            )
            self.metrics = GenAIInstruments(resource, self.semconv, interval)

    def request(self, req: HttpRequest, route: str) -> RequestTrace:
        """A new request's trace: its SERVER span, continuing the client's ``traceparent``
        (W3C trace context) when it sent one."""
        parent: Context | None = None
        traceparent = req.header("traceparent")
        if traceparent is not None:
            carrier = {"traceparent": traceparent}
            state = req.header("tracestate")
            if state is not None:
                carrier["tracestate"] = state
            parent = self.propagator.extract(carrier)
        return RequestTrace(self, req, route, parent)

    def server_of(self, base_url: str) -> tuple[str, int | None]:
        """``server.address`` and ``server.port`` of an upstream base URL (cached)."""
        found = self._servers.get(base_url)
        if found is None:
            if len(self._servers) >= _MAX_SERVERS:
                self._servers.clear()
            try:
                parts = urlsplit(base_url)
                port = parts.port or (443 if parts.scheme == "https" else 80)
                found = (parts.hostname or "", port)
            except ValueError:
                found = ("", None)
            self._servers[base_url] = found
        return found

    def shutdown(self) -> None:
        """Flush and stop the exporters (blocking: call from a worker thread)."""
        self._tracer_provider.shutdown()
        if self.metrics is not None:
            self.metrics.shutdown()
