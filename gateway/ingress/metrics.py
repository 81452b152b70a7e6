"""The ingress's Prometheus metrics, in its own registry (``GET /metrics``).

Updated three ways:

- on the hot path, once per client request (:meth:`GatewayMetrics.request`), from what the
  ingress already knows — requests, errors, latency and TTFT histograms by model, endpoint
  and surface; attempts, fallbacks, tokens; the route decision's bus round trip. Labelled
  children are cached, so a request costs a few dict lookups and counter increments;
- from low-rate operator events (:meth:`GatewayMetrics.count_event`): circuit transitions,
  key mutes, and every event by kind and type (benches included);
- at scrape time (:meth:`GatewayMetrics.render`), from the owners over the bus: circuit
  state and availability per endpoint (``llmgw.health.deep``), the request log's counters
  (``llmgw.admin.log.stats``). Every ingress mirrors this global state: aggregate it across
  ingresses with ``max``, not ``sum``.

Labels only ever take values from the config (model and endpoint ids) or small fixed sets;
never a client-supplied string. The GenAI client metrics (``gen_ai_client_*``, one observation
per upstream attempt) are labelled by operation, provider, upstream model and endpoint as the
config names them; an endpoint the config does not know counts as ``other``. With telemetry on
the same observations also go out over OTLP (``gateway.telemetry``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.ingress.metrics_sum import SummedRegistry, defer_writes, multiprocess_dir
from gateway.telemetry.names import operation_name, provider_name
from schemas import (
    AdminCommand,
    AdminReply,
    CircuitTransition,
    GatewayError,
    HealthReport,
    HealthRequest,
    subjects,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from bus import Bus
    from gateway.telemetry.genai_metrics import GenAIInstruments
    from schemas import Message, Observation, RequestCompleted
    from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)
_RTT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 1)
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
_CIRCUIT_VALUE = {"closed": 0.0, "half_open": 1.0, "open": 2.0}
_NONE = "-"


class _PerRoute:
    """The labelled children one (model, endpoint, surface) updates on every request."""

    __slots__ = ("duration", "requests", "ttft")

    def __init__(self, m: GatewayMetrics, labels: tuple[str, str, str]) -> None:
        self.requests = m.requests.labels(*labels)
        self.duration = m.duration.labels(*labels)
        self.ttft = m.ttft.labels(*labels)


class _Tokens:
    """The ``llmgw_tokens_total`` children of one (model, endpoint) an attempt went to."""

    __slots__ = ("cached", "completion", "prompt")

    def __init__(self, m: GatewayMetrics, model: str, endpoint: str) -> None:
        self.prompt = m.tokens.labels(model, endpoint, "prompt")
        self.completion = m.tokens.labels(model, endpoint, "completion")
        self.cached = m.tokens.labels(model, endpoint, "cached")


class _LogStats:
    """Collector of the request log's counters, as last read from the StoreActor, and of the
    rows this ingress dropped because its own outbox was full (cause ``ingress_full``)."""

    def __init__(self) -> None:
        self.stats: dict[str, Any] | None = None
        self.outbox_dropped: Callable[[], int] = lambda: 0

    def collect(self) -> Iterable[Metric]:
        st = self.stats
        dropped = CounterMetricFamily(
            "llmgw_log_rows_dropped", "Request log rows dropped, never waited for", labels=["cause"]
        )
        dropped.add_metric(["ingress_full"], float(self.outbox_dropped()))
        if st is None:  # the store's own counters are not known (yet)
            yield dropped
            return
        for cause in ("queue_full", "write_failed", "by_bus"):
            dropped.add_metric([cause], float(st.get(f"dropped_{cause}", 0)))
        yield dropped
        yield CounterMetricFamily(
            "llmgw_log_rows_written",
            "Request log rows committed",
            value=float(st.get("written", 0)),
        )
        yield GaugeMetricFamily(
            "llmgw_log_rows_pending",
            "Request log rows not yet committed",
            value=float(st.get("pending", 0)),
        )


class _Health:
    """Collector of every endpoint's circuit state and availability, as last reported by the
    HealthActor. A collector, not two Gauges: an endpoint a reload removed must leave the
    exposition, and a Gauge's labels cannot be cleared in prometheus-client's multiprocess mode
    (``--workers``: it warns, and its files keep every child ever made)."""

    def __init__(self) -> None:
        self.report: HealthReport | None = None

    def collect(self) -> Iterable[Metric]:
        labels = ["model", "endpoint"]
        circuit = GaugeMetricFamily(
            "llmgw_circuit_state", "Circuit: 0 closed, 1 half-open, 2 open", labels=labels
        )
        availability = GaugeMetricFamily(
            "llmgw_endpoint_availability", "Availability EWMA", labels=labels
        )
        for st in self.report.endpoints if self.report is not None else ():
            circuit.add_metric([st.model, st.endpoint], _CIRCUIT_VALUE.get(st.circuit_state, -1.0))
            availability.add_metric([st.model, st.endpoint], st.availability)
        yield circuit
        yield availability


class _PerAttempt:
    """The GenAI children one (endpoint, operation, error type) updates per attempt, and
    the same labels as OTLP attributes."""

    __slots__ = ("attributes", "duration", "input", "otlp", "output", "ttfc")

    def __init__(
        self, m: GatewayMetrics, op: str, provider: str, model: str, endpoint: str, error: str
    ) -> None:
        self.duration = m.genai_duration.labels(op, provider, model, endpoint, error)
        self.input = m.genai_tokens.labels(op, provider, model, "input")
        self.output = m.genai_tokens.labels(op, provider, model, "output")
        self.ttfc = m.genai_ttfc.labels(op, provider, model, endpoint)
        self.attributes = {
            "gen_ai.operation.name": op,
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "llmgw.endpoint": endpoint,
        }
        if error:
            self.attributes["error.type"] = error
        self.otlp = m._otlp.series(self.attributes) if m._otlp is not None else None


SPEND_CALLERS_MAX = 1000
"""Distinct (org, key) label pairs ``llmgw_spend_usd_total`` keeps per ingress."""
_OTHER = "other"


class GatewayMetrics:
    """Owns one CollectorRegistry (not the global one: tests run several gateways)."""

    def __init__(
        self, config: GatewayConfig | None = None, otlp: GenAIInstruments | None = None
    ) -> None:
        shared = multiprocess_dir()
        if shared is not None:
            defer_writes()  # before any value is made
        r = self.registry = CollectorRegistry()
        route = ["model", "endpoint", "surface"]
        self.requests = Counter("llmgw_requests", "Client requests", route, registry=r)
        self.errors = Counter(
            "llmgw_request_errors", "Client requests that failed", [*route, "kind"], registry=r
        )
        self.duration = Histogram(
            "llmgw_request_duration_seconds",
            "Total request latency",
            route,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "llmgw_request_ttft_seconds",
            "Time to first token (streams)",
            route,
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "llmgw_tokens",
            "Tokens reported by upstreams",
            ["model", "endpoint", "kind"],
            registry=r,
        )
        self.attempts = Counter(
            "llmgw_attempts",
            "Upstream attempts by outcome",
            ["model", "endpoint", "outcome"],
            registry=r,
        )
        self.fallbacks = Counter(
            "llmgw_fallbacks",
            "Requests that fell back, by last route",
            ["model", "endpoint"],
            registry=r,
        )
        self.bus_rtt = Histogram(
            "llmgw_bus_rtt_seconds",
            "Bus request/reply round trips",
            ["op"],
            buckets=_RTT_BUCKETS,
            registry=r,
        )
        self._health_view = _Health()
        r.register(self._health_view)
        self.events = Counter("llmgw_events", "Operator events seen", ["kind", "type"], registry=r)
        self.transitions = Counter(
            "llmgw_circuit_transitions", "Circuit transitions", ["endpoint", "to"], registry=r
        )
        self.key_mutes = Counter("llmgw_key_mutes", "Provider keys muted", ["pool"], registry=r)
        self.spend = Counter(
            "llmgw_spend_usd",
            "USD spent (priced with the routes' pricing:), "
            f"by model, endpoint, org and key (past {SPEND_CALLERS_MAX} "
            "org/key pairs, new ones count as org=key=other)",
            ["model", "endpoint", "org", "key"],
            registry=r,
        )
        self.unpriced = Counter(
            "llmgw_unpriced_attempts",
            "Upstream attempts that used tokens on a route with no pricing: "
            "(billed $0: no budget counts them)",
            ["model", "endpoint"],
            registry=r,
        )
        genai = ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model"]
        self.genai_duration = Histogram(
            "gen_ai_client_operation_duration_seconds",
            "GenAI operation duration, one upstream attempt (gen_ai.client.operation.duration)",
            [*genai, "llmgw_endpoint", "error_type"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.genai_tokens = Histogram(
            "gen_ai_client_token_usage",
            "Tokens per upstream attempt by gen_ai.token.type (gen_ai.client.token.usage)",
            [*genai, "gen_ai_token_type"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.genai_ttfc = Histogram(
            "gen_ai_client_operation_time_to_first_chunk_seconds",
            "Time to the first chunk of a streamed upstream attempt",
            [*genai, "llmgw_endpoint"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        # Per-request families: under `--workers`, summed over every worker (metrics_sum).
        summed: list[Counter | Histogram] = [self.requests, self.errors, self.duration]
        summed += [self.ttft, self.tokens, self.attempts, self.fallbacks, self.bus_rtt]
        summed += [self.spend, self.unpriced, self.genai_duration, self.genai_tokens]
        summed.append(self.genai_ttfc)
        self._exposed: CollectorRegistry | SummedRegistry = r
        if shared is not None:
            names = frozenset(family.name for m in summed for family in m.describe())
            self._exposed = SummedRegistry(r, shared, names)
        self._otlp = otlp
        self._upstreams: dict[str, tuple[str, str]] = {}
        self._per_attempt: dict[tuple[str, str, str], _PerAttempt] = {}
        self._unpriced_routes: dict[str, Any] = {}  # endpoint id -> its counter
        if config is not None:
            self.reconfigure(config)
        self._spend: dict[tuple[str, str, str, str], Any] = {}
        self._spend_callers: set[tuple[str, str]] = set()
        self._log = _LogStats()
        r.register(self._log)
        self._route_rtt = self.bus_rtt.labels("route")
        self._per_route: dict[tuple[str, str, str], _PerRoute] = {}
        self._tokens: dict[tuple[str, str], _Tokens] = {}
        self._errors: dict[tuple[str, str, str, str], Any] = {}
        self._attempts: dict[tuple[str, str, str], Any] = {}
        self._fallbacks: dict[tuple[str, str], Any] = {}

    # -- hot path -----------------------------------------------------------------------

    def count_log_drops(self, dropped: Callable[[], int]) -> None:
        """Export ``dropped()`` (this ingress's request-log rows dropped because its outbox
        was full) as ``llmgw_log_rows_dropped_total{cause="ingress_full"}``."""
        self._log.outbox_dropped = dropped

    def request(
        self, done: RequestCompleted, attempts: Sequence[Observation], decision_s: float | None
    ) -> None:
        """Account one finished client request and its attempts (never raises)."""
        model, endpoint = done.model or _NONE, done.endpoint or _NONE
        key = (model, endpoint, done.surface)
        per = self._per_route.get(key) or self._route(key)
        per.requests.inc()
        per.duration.observe(done.latency_ms / 1000)
        if done.ttft_ms is not None:
            per.ttft.observe(done.ttft_ms / 1000)
        if done.error_kind:
            ekey = (model, endpoint, done.surface, done.error_kind)
            child = self._errors.get(ekey)
            if child is None:
                child = self._errors[ekey] = self.errors.labels(*ekey)
            child.inc()
        if done.fallback:
            fkey = (model, endpoint)
            child = self._fallbacks.get(fkey)
            if child is None:
                child = self._fallbacks[fkey] = self.fallbacks.labels(*fkey)
            child.inc()
        for obs in attempts:
            akey = (obs.model, obs.endpoint, obs.outcome)
            child = self._attempts.get(akey)
            if child is None:
                child = self._attempts[akey] = self.attempts.labels(*akey)
            child.inc()
            self._genai(obs)
            # Per attempt, on the endpoint that used them (a failed-over attempt's tokens are
            # its endpoint's, not the one that served); reported tokens only: an estimate is
            # the gateway's guess (its cost, estimated too, is in llmgw_spend_usd_total).
            tkey = (obs.model or _NONE, obs.endpoint or _NONE)
            tok = self._tokens.get(tkey)
            if tok is None:
                tok = self._tokens[tkey] = _Tokens(self, *tkey)
            if obs.prompt_tokens:
                tok.prompt.inc(obs.prompt_tokens)
            if obs.completion_tokens:
                tok.completion.inc(obs.completion_tokens)
            if obs.cached_tokens:
                tok.cached.inc(obs.cached_tokens)
            if obs.billed_tokens and (unpriced := self._unpriced_routes.get(obs.endpoint)):
                unpriced.inc()
        if decision_s is not None:
            self._route_rtt.observe(decision_s)
        if done.cost_usd:
            self._count_spend(done, attempts)

    def _count_spend(self, done: RequestCompleted, attempts: Sequence[Observation]) -> None:
        caller = (done.org or _NONE, done.key_id or _NONE)
        if caller not in self._spend_callers:
            if len(self._spend_callers) >= SPEND_CALLERS_MAX:
                caller = (_OTHER, _OTHER)  # bounded: a scrape must not grow with the key table
            else:
                self._spend_callers.add(caller)
        for obs in attempts:
            if obs.cost_usd:
                skey = (obs.model or _NONE, obs.endpoint or _NONE, *caller)
                child = self._spend.get(skey)
                if child is None:
                    child = self._spend[skey] = self.spend.labels(*skey)
                child.inc(obs.cost_usd)

    def reconfigure(self, config: GatewayConfig) -> None:
        """Take the endpoints (their provider and upstream model, which are unpriced) from
        ``config``."""
        unpriced = set(config.unpriced_endpoints())
        self._unpriced_routes = {  # labels from the config alone
            eid: self.unpriced.labels(m.id, eid)
            for m in config.models
            for eid in m.endpoint_ids()
            if eid in unpriced
        }
        self._upstreams = {
            eid: (provider_name(route.kind), route.provider_model_id or m.id)
            for m in config.models
            for eid, route in zip(m.endpoint_ids(), m.route, strict=True)
        }
        self._per_attempt.clear()  # children of removed endpoints stay in the registry

    def _genai(self, obs: Observation) -> None:
        """One attempt's GenAI observations (a probe of a route counts like any attempt)."""
        error = obs.error_kind if obs.outcome != "success" else ""
        key = (obs.endpoint, obs.surface, error)
        per = self._per_attempt.get(key)
        if per is None:
            upstream = self._upstreams.get(obs.endpoint)
            provider, model = upstream or (_OTHER, _OTHER)
            endpoint = obs.endpoint if upstream is not None else _OTHER
            per = _PerAttempt(self, operation_name(obs.surface), provider, model, endpoint, error)
            if len(self._per_attempt) < 4096:
                self._per_attempt[key] = per
        seconds = obs.latency_ms / 1000
        ttfc = obs.ttft_ms / 1000 if obs.stream and obs.ttft_ms is not None else None
        per.duration.observe(seconds)
        if obs.prompt_tokens:
            per.input.observe(obs.prompt_tokens)
        if obs.completion_tokens:
            per.output.observe(obs.completion_tokens)
        if ttfc is not None:
            per.ttfc.observe(ttfc)
        if per.otlp is not None:
            per.otlp.record(seconds, obs.prompt_tokens, obs.completion_tokens, ttfc)

    def _route(self, key: tuple[str, str, str]) -> _PerRoute:
        per = self._per_route[key] = _PerRoute(self, key)
        return per

    # -- events and scrapes -------------------------------------------------------------

    def count_event(self, subject: str, msg: Message) -> None:
        """Count one operator event from ``llmgw.events.<kind>``."""
        kind = subjects.untoken(subject.rsplit(".", 1)[-1])
        self.events.labels(kind, type(msg).__name__).inc()
        if isinstance(msg, CircuitTransition):
            self.transitions.labels(msg.endpoint, msg.new).inc()
        elif type(msg).__name__ == "KeyMuted":
            self.key_mutes.labels(str(getattr(msg, "pool", ""))).inc()

    async def render(self, bus: Bus, timeout: float) -> bytes:
        """Refresh the scrape-time gauges from the owners, then the text exposition."""
        await asyncio.gather(self._health(bus, timeout), self._log_stats(bus, timeout))
        return generate_latest(self._exposed)

    async def _health(self, bus: Bus, timeout: float) -> None:
        started = time.perf_counter()
        try:
            report = await bus.request(
                subjects.HEALTH_DEEP, HealthRequest(), reply_type=HealthReport, timeout=timeout
            )
        except GatewayError as exc:
            logger.warning("metrics: endpoint health not available: %s", exc)
            return
        self.bus_rtt.labels("health").observe(time.perf_counter() - started)
        if not isinstance(report, HealthReport):
            return
        self._health_view.report = report  # endpoints removed by a reload disappear

    async def _log_stats(self, bus: Bus, timeout: float) -> None:
        try:
            reply = await bus.request(
                subjects.admin("log", "stats"),
                AdminCommand(by="metrics"),
                reply_type=AdminReply,
                timeout=timeout,
            )
        except GatewayError as exc:
            logger.debug("metrics: request log stats not available: %s", exc)
            return
        if isinstance(reply, AdminReply):
            self._log.stats = reply.result
