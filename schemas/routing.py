"""Messages of the routing conversation: decisions, observations, endpoint state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from schemas.errors import ErrorReply

if TYPE_CHECKING:
    from collections.abc import Mapping


class RouteRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ingress asks a ModelActor which routes should serve one request."""

    model: str
    caller: str = ""
    modalities: tuple[str, ...] = ()
    prompt_tokens: int = 0
    # The most output tokens it allows (``max_tokens`` times ``n``; None: no cap): what a
    # provider reserves of a token limit while it answers.
    output_cap: int | None = None
    # Without a cap, the thinking budget it asks (a Claude route is sent its default
    # max_tokens plus this).
    thinking_budget: int = 0
    pin: str | None = None
    surface: str = "chat"
    request_id: str = ""
    role: str | None = None  # the caller's tier; None: no user identity (unrestricted)
    # A dry run (routing explain): the plan says which route and probe it would take but
    # takes no lease (probe, prefill) and writes no affinity pin.
    dry: bool = False
    # Who renews and releases a capacity lease the decision takes (the asking ingress).
    lease_holder: str = ""


class RouteCandidate(msgspec.Struct, frozen=True, kw_only=True):
    """One route the ingress may try: where to send, which upstream model, which credential.

    ``credential_id`` is a short hash; the secret itself never crosses the bus. ``probe`` marks
    the half-open probe lease: its outcome closes or re-opens the circuit. ``refusal`` marks
    a route whose key pool refused this caller (``key_pool_exhausted`` or
    ``key_pool_role_restricted``): it is never sent, only accounted, and sits after every
    sendable candidate; ``retry_after`` is then when one of its keys unmutes. ``pool`` names
    the capacity pool of a quota or concurrency route; ``lease_id`` is the lease its owner
    granted for this request (empty: not leased yet; the ingress leases it before sending).
    ``spare_credentials`` are the route's other usable keys, in the pool's order: an attempt
    the upstream refuses for its key (401, 402, 403, a spent quota) is tried again at once on
    the next of them, on the same route.
    """

    endpoint: str
    kind: str
    base_url: str = ""
    upstream_model: str = ""
    credential_id: str = ""
    probe: bool = False
    context_window: int | None = None
    refusal: str = ""
    retry_after: float | None = None
    pool: str = ""
    lease_id: str = ""
    spare_credentials: tuple[str, ...] = ()


class RouteSkip(msgspec.Struct, frozen=True, kw_only=True):
    """A route a decision passed over for load, not health: ``reason`` ``cooling`` (its
    provider's 429; back at ``until``), ``rate_limit`` (its provider's limit, as its answers
    reported it, has no request left until ``until``) or ``capacity`` (``in_flight`` at its
    learned ``limit``); the last two spilled to the next route, kept last among the
    fallbacks."""

    endpoint: str
    reason: str
    until: float | None = None
    limit: float | None = None
    in_flight: int = 0


class RoutePlan(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A ModelActor's decision: the primary first, then fallbacks in order; ``skipped`` the
    routes it passed over for cooling or capacity."""

    model: str
    candidates: tuple[RouteCandidate, ...]
    pinned: bool = False
    reason: str = "weighted"
    routewise: tuple[RouteWiseCandidate, ...] = ()  # dry plans of RouteWise models only
    # RouteWise hedging: when the primary has no first byte this long after it started, the
    # ingress also sends the plan's second candidate; the first to answer serves.
    hedge_after_ms: float | None = None
    skipped: tuple[RouteSkip, ...] = ()


class RouteBatch(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ingress -> ModelActor over NATS: the route requests for one model that one ingress
    began in one turn of its event loop (answered with RouteBatchReply, one answer per
    request, in order): one message and one round trip for many concurrent requests."""

    requests: tuple[RouteRequest, ...]


class RouteBatchReply(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The ModelActor's answers to a RouteBatch, in its order: each request's plan, or the
    error that request alone met."""

    replies: tuple[RoutePlan | ErrorReply, ...]


class Observation(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """What happened on one upstream attempt; the ingress publishes one per attempt.

    ``outcome`` is ``success``, ``failure`` (counts against the endpoint), ``client_error``
    (the caller's request was refused; does not count) or ``cancelled`` (the client went away;
    does not count).

    ``prompt_tokens`` ... ``cache_write_tokens`` are what the upstream reported (what
    RouteWise, scoring, quotas and ``gen_ai.usage`` learn from: never a guess).
    ``cost_usd`` prices the attempt with its route's ``pricing:``; ``billed_tokens`` is the
    prompt plus completion tokens that were priced. ``cost_estimated``: the upstream reported
    no usage, so the gateway's estimate (prompt size, characters sent) was priced instead:
    ``prompt_estimate`` and the rest of ``billed_tokens`` (:func:`priced_tokens`).
    ``trace_id``: the request's OpenTelemetry trace (32 hex digits; "" when telemetry is off).
    ``committed``: the attempt's answer had begun reaching the client (a relayed stream): the
    request goes to no other route, whatever the outcome. ``rate``: the request rate limit's
    state a whole answer's headers reported (a stream's comes sooner, on its ``FirstToken``).
    """

    endpoint: str
    model: str
    outcome: str
    attempt: int = 1
    status: int | None = None
    error_kind: str = ""
    auth_rejection: bool = False
    probe: bool = False
    stream: bool = False
    fallback: bool = False
    ttft_ms: float | None = None
    latency_ms: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    retry_after: float | None = None
    caller: str = ""
    request_id: str = ""
    surface: str = "chat"
    credential_id: str = ""
    ts: float = 0.0
    prompt_estimate: int = 0
    role: str | None = None
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    cost_estimated: bool = False
    billed_tokens: int = 0
    trace_id: str = ""
    committed: bool = False
    rate: RateReport | None = None


QUOTA_EXHAUSTED = "quota_exhausted"
"""The error kind of a 429 that says a quota or the billing is exhausted (not a pace)."""

HEDGE_DECLINED = "hedge_declined"
"""The error kind of a hedge race's loser, cancelled because the other side answered first."""

RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
"""The error kind of a 429 whose ``x-ratelimit-remaining-*`` headers say the provider meters
requests or tokens per period: a pace that cooling keeps, not a concurrency it cannot take
(``http_429`` when the answer does not say which)."""


def priced_tokens(obs: Observation) -> tuple[int, int]:
    """The (prompt, completion) tokens ``obs``'s cost was computed from: the reported usage,
    or, when ``cost_estimated``, the gateway's estimate (what the request log shows) with the
    prompt a stream's start reported, if it did."""
    if obs.cost_estimated:
        prompt = obs.prompt_tokens or obs.prompt_estimate
        return prompt, max(0, obs.billed_tokens - prompt)
    return obs.prompt_tokens, obs.completion_tokens


def is_backpressure(obs: Observation) -> bool:
    """Whether ``obs`` is a provider's rate-limit answer (a 429 that is not a quota or billing
    exhaustion): back-pressure that cools the credential, never sickness that counts toward a
    circuit or a bench."""
    return obs.status == 429 and obs.outcome == "failure" and obs.error_kind != QUOTA_EXHAUSTED


def is_backpressure_row(row: Mapping[str, Any]) -> bool:
    """:func:`is_backpressure` of a request-log row (its ``status``, ``outcome`` and
    ``error_kind`` columns)."""
    return (
        row.get("status") == 429
        and row.get("outcome") == "failure"
        and row.get("error_kind") != QUOTA_EXHAUSTED
    )


class RateReport(msgspec.Struct, frozen=True, kw_only=True):
    """What an answer's headers said of its provider's request rate limit (OpenAI's
    ``x-ratelimit-{limit,remaining,reset}-requests``): ``limit`` requests a period, of which
    ``remaining`` were left once this request was taken, and ``reset_seconds`` until all of
    them are back (OpenAI and Anthropic both mean the whole allowance, not one request).
    ``tokens``: its token limit's, in tokens, when the answer reported one too (OpenAI's
    ``x-ratelimit-*-tokens``, Anthropic's ``anthropic-ratelimit-tokens-*``, input and output
    together); ``output_tokens``: its output token limit's, when the provider meters output
    apart (Anthropic's ``anthropic-ratelimit-output-tokens-*``: ``tokens`` is then its input
    token limit's, ``-input-tokens-*``)."""

    limit: int
    remaining: int
    reset_seconds: float
    tokens: RateReport | None = None
    output_tokens: RateReport | None = None


class FirstToken(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The ingress relayed a stream's first chunk: the prefill lease of ``request_id`` ends.
    ``unsent``: the candidate ``endpoint`` of that request will not be attempted at all (its
    in-flight count moves on to the next candidate, or ends). ``spent_for``: the answer's
    ``x-ratelimit-remaining-*`` said a provider limit of ``endpoint`` is spent for this many
    seconds (the route is treated as at its limit until then). ``rate``: the request rate
    limit's state the answer reported, by which the model paces what it sends to
    ``endpoint`` (``actors/state/rate_pace.py``)."""

    endpoint: str
    request_id: str
    unsent: bool = False
    spent_for: float | None = None
    rate: RateReport | None = None
    credential_id: str = ""  # the key the answer that reported ``rate`` was sent with


class ObservationBatch(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ingress -> the observations' subscribers over NATS: the observations of one endpoint
    that one ingress made in one turn of its event loop, on that endpoint's subject (the
    receiving bus delivers each as its own Observation: subscribers never see a batch)."""

    observations: tuple[Observation, ...]


class SetWeight(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Admin: set a route's weight (``weight=None`` restores the configured one)."""

    endpoint: str
    weight: float | None = None


class LocalHealth(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A health-check pass found a local deployment's ``/health`` answering or not."""

    endpoint: str
    healthy: bool


class EndpointState(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """An EndpointActor's health and circuit, published on every change."""

    endpoint: str
    model: str
    circuit_state: str
    availability: float
    consecutive_failures: int = 0
    consecutive_auth_rejections: int = 0
    open_until: float | None = None
    probe_in_flight: bool = False
    seq: int = 0
    benched_until: float | None = None
    bench_reason: str = ""  # why it is benched (as BenchChanged said); "" when not benched


class StateRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask an EndpointActor for its current EndpointState."""


class ProbeRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask an EndpointActor for the single half-open probe lease."""

    request_id: str = ""


class ProbeGrant(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Answer to ProbeRequest: ``granted`` or not, and when to ask again."""

    granted: bool
    retry_after: float | None = None


class HealthRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask the HealthActor for every endpoint's state."""


class HealthReport(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Every endpoint's last known state, as the HealthActor's view holds it."""

    endpoints: tuple[EndpointState, ...]


class ModelStatusRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask a ModelActor for its routes and their effective weights."""


class RouteStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One route as its ModelActor sees it."""

    endpoint: str
    kind: str
    weight: float
    configured_weight: float
    circuit_state: str
    # Load (the ModelActor's count and AIMD estimate, actors/state/route_load.py):
    in_flight: int = 0
    learned_limit: float | None = None  # None: no congestion seen (or no cap)
    limit_reason: str = ""  # rate_limited, ttft_inflated or grew
    ttft_baseline_ms: float | None = None
    ttft_recent_ms: float | None = None
    cooling_until: float | None = None  # every key the route has is cooling until then
    rate_limit_until: float | None = None  # its provider's reported limit spent until then
    fallback_only: bool = False  # a backup, never drawn: its weight is 0 whatever configured
    overridden: bool = False  # an admin override sets its weight (routing/set_weight)


class RouteWiseCandidate(msgspec.Struct, frozen=True, kw_only=True):
    """One route as a RouteWise model's LP sees it (explain, /health/deep).

    ``effective_cost_usd`` is None for a masked or infeasible route, and ``excluded`` says
    why (``quota_unresolved``, ``quota_exhausted``, ``envelope_uncalibrated``,
    ``concurrency_full``, ``capacity_full``: at its learned limit); ``latency_ms`` is the
    TTFT estimate the LP used (the unprofiled default when ``profiled`` is False; queueing
    against the learned limit included); ``lp_weight`` its share of the LP's mix.
    """

    endpoint: str
    provider_type: str
    effective_cost_usd: float | None
    latency_ms: float
    profiled: bool
    lp_weight: float
    quota_used_fraction: float | None = None
    free_slots: float | None = None
    excluded: str = ""
    samples: int = 0  # live-window TTFT samples behind latency_ms


class ModelStatus(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A ModelActor's routes with effective weights and the circuits it sees; a RouteWise
    model adds its candidates for a request of ``routewise_prompt_tokens``."""

    model: str
    router: str
    routes: tuple[RouteStatus, ...]
    routewise: tuple[RouteWiseCandidate, ...] = ()
    routewise_prompt_tokens: int = 0


class ProbeDue(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A benched route is due its background re-validation; a prober sends one tiny request."""

    endpoint: str
    model: str
    candidate: RouteCandidate
    credential_id: str = ""  # set: re-validate this muted credential, not the route


class ProbeResult(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """What the background probe of ``endpoint`` found."""

    endpoint: str
    ok: bool
    detail: str = ""
    credential_id: str = ""  # the credential the probe used ("" with an admin's lift: all)
    # True: a muted credential's probe, whose failure says nothing about the route's bench.
    credential_only: bool = False


class ModeRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask the DegradedModeActor for the current mode (answered with ModeChanged)."""


class ProbeFirstByte(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A half-open probe sent as a stream produced its first chunk: the endpoint answers, so
    the circuit can close now rather than when a long stream ends."""

    endpoint: str
    request_id: str


class RouteWiseSettingsGet(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask the RouteWiseSettingsActor for the current RouteWiseSettings."""


class RouteWiseSettings(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The admin's RouteWise settings: ``models`` the per-model overrides (canonical model id
    -> ``router_params`` key -> value), ``fallback`` the deployment fallback (key -> value).
    Precedence: model override, then the model's ``router_params:``, then the fallback, then
    the default."""

    models: dict[str, dict[str, Any]] = {}
    fallback: dict[str, Any] = {}
    ts: float = 0.0


class LatencyProbeDue(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A RouteWise model wants a TTFT sample of an idle or never-measured route: a prober
    (queue group ``routewise-probers``, one takes each) sends one 1-token request."""

    endpoint: str
    model: str
    candidate: RouteCandidate
    timeout: float = 30.0


class LatencySample(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """What the RouteWise prober measured at ``endpoint``: the time to the answer of a 1-token
    request (``ok``), or why it failed. Feeds only the model's latency evidence."""

    endpoint: str
    model: str
    ok: bool
    ttft_ms: float | None = None
    detail: str = ""
    ts: float = 0.0
