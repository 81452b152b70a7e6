"""The process's OpenTelemetry providers: traces and GenAI metrics over OTLP/HTTP.

Imported only when ``telemetry.enabled`` (see :func:`gateway.telemetry.start_telemetry`). The
SDK reads the standard ``OTEL_*`` variables itself: ``OTEL_EXPORTER_OTLP_ENDPOINT`` and
``..._HEADERS``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME`` (over
``telemetry.service_name``), ``OTEL_TRACES_SAMPLER``/``_ARG`` (unless ``sampler_ratio`` is
set), ``OTEL_BSP_*`` (the batch span processor's schedule) and
``OTEL_METRIC_EXPORT_INTERVAL`` (over ``metrics_interval_seconds``),
``OTEL_SEMCONV_STABILITY_OPT_IN`` (gateway.telemetry.semconv) and
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (over ``capture_content``).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.telemetry.otlp_wire import WireSpanExporter
from gateway.telemetry.request_trace import RequestTrace
from gateway.telemetry.semconv import Semconv, capture_content

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from gateway.ingress.request import HttpRequest
    from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)

_MAX_SERVERS = 1024  # (address, port) per base URL; base URLs come from the config
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
_SECONDS_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48)


class Telemetry:
    """Owns one TracerProvider (BatchSpanProcessor -> OTLP/HTTP) and one MeterProvider
    (periodic OTLP/HTTP export of the GenAI metrics); hands each request a RequestTrace."""

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
        self._tracer_provider.add_span_processor(BatchSpanProcessor(WireSpanExporter()))
        self.tracer = self._tracer_provider.get_tracer("llmgw")
        self.propagator = TraceContextTextMapPropagator()
        self.semconv = Semconv.from_env()
        self.capture_content = capture_content(settings.capture_content)
        self.capture_max_chars = settings.capture_max_chars
        self._servers: dict[str, tuple[str, int | None]] = {}
        self._meter_provider: MeterProvider | None = None
        self.metrics: GenAIInstruments | None = None
        if settings.metrics:
            interval = (
                None
                if os.environ.get("OTEL_METRIC_EXPORT_INTERVAL")
                else settings.metrics_interval_seconds * 1000
            )
            reader = PeriodicExportingMetricReader(
                OTLPMetricExporter(), export_interval_millis=interval
            )
            self._meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
            self.metrics = GenAIInstruments(self._meter_provider, self.semconv)

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
        if self._meter_provider is not None:
            self._meter_provider.shutdown()


class GenAIInstruments:
    """The GenAI client metrics exported over OTLP (``/metrics`` has the same in Prometheus
    naming, gateway/ingress/metrics.py). Attribute values come from the config only."""

    def __init__(self, provider: MeterProvider, semconv: Semconv) -> None:
        meter = provider.get_meter("llmgw")
        self._old_provider_key = not semconv.genai_latest
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration (one upstream attempt)",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
        )
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Tokens used per upstream attempt, by gen_ai.token.type",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        )
        self.ttfc = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            unit="s",
            description="Time to the first chunk of a streamed answer",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
        )

    def record(
        self,
        labels: dict[str, str],
        seconds: float,
        input_tokens: int,
        output_tokens: int,
        ttfc: float | None,
    ) -> None:
        """Record one attempt (``labels``: the operation's bounded attributes, named as the
        latest conventions name them)."""
        if self._old_provider_key and "gen_ai.provider.name" in labels:
            labels = dict(labels)
            labels["gen_ai.system"] = labels.pop("gen_ai.provider.name")
        self.duration.record(seconds, labels)
        if input_tokens:
            self.tokens.record(input_tokens, {**labels, "gen_ai.token.type": "input"})
        if output_tokens:
            self.tokens.record(output_tokens, {**labels, "gen_ai.token.type": "output"})
        if ttfc is not None:
            self.ttfc.record(ttfc, labels)
