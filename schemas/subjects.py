"""Every subject name on the bus; no other module writes a subject literal.

Catalogue (prefix ``llmgw``; ``<id>`` always goes through :func:`token`):

- ``llmgw.model.<id>.route``        request/reply  ingress -> ModelActor: RouteRequest -> RoutePlan
- ``llmgw.model.<id>.status``       request/reply  ingress -> ModelActor: ModelStatusRequest
                                                    -> ModelStatus (effective weights)
- ``llmgw.model.<id>.first_token`` event         ingress -> ModelActor: FirstToken (prefill
                                                    lease ends at a stream's first chunk)
- ``llmgw.model.<id>.weights``      request/reply  admin -> ModelActor: SetWeight -> ModelStatus
- ``llmgw.model.<id>.routewise``    request/reply  RouteWiseSettingsActor -> ModelActor:
                                                    RouteWiseSettings -> ModelStatus (applied)
- ``llmgw.endpoint.<id>.local_health`` event       health-check loop -> ModelActor: LocalHealth
- ``llmgw.endpoint.<id>.probe``     request/reply  ModelActor -> EndpointActor: ProbeRequest
                                                    -> ProbeGrant (the half-open lease)
- ``llmgw.endpoint.<id>.get``       request/reply  anyone -> EndpointActor: StateRequest
                                                    -> EndpointState
- ``llmgw.endpoint.<id>.state``     event          EndpointActor -> views: EndpointState
- ``llmgw.obs.<endpoint>``          event          ingress -> EndpointActor, ModelActor, KeyPool:
                                                    Observation (one per upstream attempt)
- ``llmgw.endpoint.<id>.probe_result`` event      prober -> EndpointActor: ProbeResult
- ``llmgw.probe.due``               event (queue)  EndpointActor -> prober: ProbeDue
- ``llmgw.mode.get``                request/reply  anyone -> DegradedModeActor: ModeRequest
                                                    -> ModeChanged
- ``llmgw.health.deep``             request/reply  ingress -> HealthActor: HealthRequest
                                                    -> HealthReport
- ``llmgw.events.<kind>``           event          owners -> operators: CircuitTransition, ...
                                                    (``decision``: RouteDecided, ``config``:
                                                    ConfigChanged, ``admin``: AdminExecuted,
                                                    ``budget``: BudgetThreshold, ``limits``:
                                                    LeaseExpired, ``capacity``: RouteCapacity,
                                                    ``chains``: ChainModelsDropped,
                                                    ``keypool``: KeyMuted/KeyUnmuted/KeyCooling)
- ``llmgw.request.<model>.done``    event          ingress -> listeners: RequestCompleted (one
                                                    per client request)
- ``llmgw.log.append``              request/reply  ingress -> StoreActor (queue ``store``):
                                                    LogAppend -> LogAppended once committed
- ``llmgw.admin.<area>.<verb>``     request/reply  operators (CLI, HTTP admin) -> the area's
                                                    owner: AdminCommand -> AdminReply
- ``llmgw.keypool.<id>.state``      event          KeyPoolActor -> ModelActor views:
                                                    KeyPoolState (declaration, mutes, cooling)
- ``llmgw.keypool.<id>.get``        request/reply  anyone -> KeyPoolActor: KeyPoolStateRequest
                                                    -> KeyPoolState
- ``llmgw.keypool.<id>.acquire``    request/reply  tools -> KeyPoolActor: KeyAcquire -> KeyGrant
                                                    (plans never ask: ModelActors decide)
- ``llmgw.keys.registry.get``       request/reply  KeyPoolActor -> KeyRegistryActor:
                                                    KeyDeclarationsRequest -> KeyDeclarations
- ``llmgw.keys.registry.declarations`` event       KeyRegistryActor -> KeyPoolActors, ingress:
                                                    KeyDeclarations (database keys, reservations)
- ``llmgw.keys.registry.secret``    request/reply  ingress -> KeyRegistryActor:
                                                    ProviderSecretRequest -> ProviderSecretGrant
                                                    (one database key's secret, short-lived;
                                                    only ingress and actors credentials may ask)
- ``llmgw.rules.get``                request/reply  ingress -> RulesActor: RulesGet -> RulesState
- ``llmgw.rules.state``              event          RulesActor -> ingress views: RulesState (the
                                                    routing rule set, on every change)
- ``llmgw.auth.keys.changed``       event          ApiKeyAdminActor, CLI -> every ingress:
                                                    ApiKeyCreated, ApiKeyRevoked (drop cached
                                                    keys at once)
- ``llmgw.auth.keys.lookup``        request/reply  ingress -> ApiKeyAdminActor: ApiKeyLookup
                                                    -> ApiKeyInfo (by hash; never the key)
- ``llmgw.auth.state.get``          request/reply  ingress -> ApiKeyAdminActor:
                                                    AuthStateRequest -> AuthState
- ``llmgw.auth.state``              event          ApiKeyAdminActor -> ingress views: AuthState
                                                    (at start and when the first key appears)
- ``llmgw.dashboard.session.ended`` event         ingress -> every ingress:
                                                    DashboardSessionEnded (a signed-out
                                                    session's id, never its token)
- ``llmgw.chain.<name>.resolve``     request/reply  anyone -> ChainActor: ChainGet -> ChainState
- ``llmgw.chain.<name>.edit``        request/reply  SteeringActor -> ChainActor: ChainEdit
                                                    -> ChainState (admin changes)
- ``llmgw.chain.<name>.state``       event          ChainActor -> ingress views: ChainState
- ``llmgw.steering.get``            request/reply  ingress -> SteeringActor: SteeringGet
                                                    -> SteeringSnapshot
- ``llmgw.steering.check``          request/reply  config owners -> SteeringActor: ChainsCheck
                                                    -> ChainsChecked (a reload, before it changes
                                                    anything: would a chain name a model the
                                                    new config lacks?)
- ``llmgw.steering.state``          event          SteeringActor -> ingress views: SteeringState
- ``llmgw.steering.evidence``       event          SteeringActor -> ingress views: Evidence
                                                    (scoring evidence, at a bounded rate)
- ``llmgw.limits.admit``           request/reply  ingress -> LimitsActor: AdmitRequest -> AdmitReply
                                                    (a request's rate/budget lease)
- ``llmgw.limits.settle``          event          ingress -> LimitsActor: LimitSettle (usage and
                                                    cost replace the reservation)
- ``llmgw.limits.renew``           event          ingress -> LimitsActor: LimitRenew (batched)
- ``llmgw.limits.get``             request/reply  ingress -> LimitsActor: LimitsGet -> LimitsState
- ``llmgw.limits.state``           event          LimitsActor -> ingress views: LimitsState
                                                    (every limit, on every change)
- ``llmgw.capacity.<pool>.acquire`` request/reply ModelActor (a plan's primary), ingress (a
                                                    fallback), prober -> CapacityActor:
                                                    CapacityAcquire -> CapacityGrant
- ``llmgw.capacity.<pool>.renew``   event          ingress -> CapacityActor: CapacityRenew
- ``llmgw.capacity.<pool>.release`` event          ingress -> CapacityActor: CapacityRelease
- ``llmgw.capacity.<pool>.get``     request/reply  anyone -> CapacityActor: CapacityGet
                                                    -> CapacityState
- ``llmgw.capacity.<pool>.state``   event          CapacityActor -> views: CapacityState
- ``llmgw.capacity.<pool>.reading`` event          quota poller (sidecar) -> CapacityActor:
                                                    QuotaReading (an http_json poll)
- ``llmgw.events.quota``            event          CapacityActor -> operators:
                                                    QuotaSourceStatus (unresolved / resolved)
- ``llmgw.routewise.settings.get``  request/reply  ModelActor -> RouteWiseSettingsActor:
                                                    RouteWiseSettingsGet -> RouteWiseSettings
- ``llmgw.routewise.settings``      event          RouteWiseSettingsActor -> watchers:
                                                    RouteWiseSettings (every admin change)
- ``llmgw.routewise.probe``         event (queue)  ModelActor -> RouteWise prober:
                                                    LatencyProbeDue (idle or cold route)
- ``llmgw.model.<id>.latency``      event          RouteWise prober -> ModelActor:
                                                    LatencySample
- ``llmgw.cluster.alive.<node>``    req/reply      actors host -> actors host ``node``:
                                                    HostAlive -> HostAlive (is it alive)
- ``llmgw.sys.supervisor.<name>.event`` event      supervisors -> operators: ChildStarted,
                                                    ChildFailed, ChildRestarted, SupervisorGaveUp
"""

from __future__ import annotations

import functools
import re

PREFIX = "llmgw"

_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
# One C-level match instead of a Python loop per character: every request builds subjects.
_ALL_SAFE = re.compile(r"[A-Za-z0-9_-]+")


def token(raw: str) -> str:
    """Escape ``raw`` into one subject token: ``[A-Za-z0-9_-]`` stay, every other byte is ``~hh``.

    Reversible (see :func:`untoken`), so ``org/model:7b`` or ``qwen2.5`` never adds a dot.
    """
    if _ALL_SAFE.fullmatch(raw):
        return raw
    return _escaped(raw)


@functools.lru_cache(maxsize=4096)  # endpoint ids (``model#0``) are escaped on every attempt
def _escaped(raw: str) -> str:
    out: list[str] = []
    for ch in raw:
        if ch in _SAFE:
            out.append(ch)
        else:
            out.extend(f"~{b:02x}" for b in ch.encode())
    return "".join(out) or "~"


def untoken(tok: str) -> str:
    """Invert :func:`token`. Raises ValueError on a malformed escape."""
    if tok == "~":
        return ""
    raw = bytearray()
    i = 0
    while i < len(tok):
        if tok[i] == "~":
            raw.append(int(tok[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.extend(tok[i].encode())
            i += 1
    return raw.decode()


def model_route(model: str) -> str:
    """Request/reply: RouteRequest -> RoutePlan | ErrorReply."""
    return f"{PREFIX}.model.{token(model)}.route"


def model_status(model: str) -> str:
    """Request/reply: ModelStatusRequest -> ModelStatus."""
    return f"{PREFIX}.model.{token(model)}.status"


def model_first_token(model: str) -> str:
    """Event: FirstToken, when a routed stream's first chunk reaches the client."""
    return f"{PREFIX}.model.{token(model)}.first_token"


def model_weights(model: str) -> str:
    """Request/reply: SetWeight -> ModelStatus."""
    return f"{PREFIX}.model.{token(model)}.weights"


def model_latency(model: str) -> str:
    """Event: LatencySample, a RouteWise prober's measurement for ``model``'s route."""
    return f"{PREFIX}.model.{token(model)}.latency"


def model_routewise(model: str) -> str:
    """Request/reply: RouteWiseSettings -> ModelStatus, once the model applies them."""
    return f"{PREFIX}.model.{token(model)}.routewise"


def endpoint_local_health(endpoint: str) -> str:
    """Event: LocalHealth from the health-check loop."""
    return f"{PREFIX}.endpoint.{token(endpoint)}.local_health"


def endpoint_probe(endpoint: str) -> str:
    """Request/reply: ProbeRequest -> ProbeGrant."""
    return f"{PREFIX}.endpoint.{token(endpoint)}.probe"


def endpoint_get(endpoint: str) -> str:
    """Request/reply: StateRequest -> EndpointState."""
    return f"{PREFIX}.endpoint.{token(endpoint)}.get"


def endpoint_state(endpoint: str) -> str:
    """Event: EndpointState, published by the EndpointActor on every change."""
    return f"{PREFIX}.endpoint.{token(endpoint)}.state"


def observation(endpoint: str) -> str:
    """Event: Observation, one per upstream attempt."""
    return f"{PREFIX}.obs.{token(endpoint)}"


def event(kind: str) -> str:
    """Event: an operator-facing event of ``kind`` (one of :data:`EVENT_KINDS`)."""
    return f"{PREFIX}.events.{token(kind)}"


# Every kind of ``llmgw.events.<kind>`` (the README's event table), so a filter naming
# another is refused instead of waiting forever.
EVENT_KINDS = (
    "admin",
    "auth_rejected",
    "bench",
    "budget",
    "capacity",
    "chains",
    "circuit",
    "config",
    "decision",
    "keypool",
    "limits",
    "mode",
    "model_breaker",
    "quota",
    "rules",
)


def request_done(model: str) -> str:
    """Event: RequestCompleted, one per client request."""
    return f"{PREFIX}.request.{token(model)}.done"


def admin(area: str, verb: str) -> str:
    """Request/reply: AdminCommand -> AdminReply, answered by ``area``'s owner."""
    return f"{PREFIX}.admin.{token(area)}.{token(verb)}"


def admin_area(area: str) -> str:
    """The pattern of every verb of admin ``area`` (its owner subscribes to it)."""
    return f"{PREFIX}.admin.{token(area)}.*"


def admin_parts(subject: str) -> tuple[str, str]:
    """(area, verb) of an admin subject. Raises ValueError for any other subject."""
    parts = subject.split(".")
    if len(parts) != 4 or parts[0] != PREFIX or parts[1] != "admin":
        raise ValueError(f"not an admin subject: {subject!r}")
    return untoken(parts[2]), untoken(parts[3])


def keypool_state(pool: str) -> str:
    """Event: KeyPoolState, published by the KeyPoolActor on every change."""
    return f"{PREFIX}.keypool.{token(pool)}.state"


def keypool_get(pool: str) -> str:
    """Request/reply: KeyPoolStateRequest -> KeyPoolState."""
    return f"{PREFIX}.keypool.{token(pool)}.get"


def keypool_acquire(pool: str) -> str:
    """Request/reply: KeyAcquire -> KeyGrant | ErrorReply (key_pool_exhausted, ...)."""
    return f"{PREFIX}.keypool.{token(pool)}.acquire"


def cluster_alive(node: str) -> str:
    """Request/reply: HostAlive -> HostAlive, answered by actors host ``node`` itself."""
    return f"{PREFIX}.cluster.alive.{token(node)}"


def supervisor_event(name: str) -> str:
    """Event: a supervisor's ChildStarted/ChildFailed/ChildRestarted/SupervisorGaveUp."""
    return f"{PREFIX}.sys.supervisor.{token(name)}.event"


def endpoint_probe_result(endpoint: str) -> str:
    """Event: ProbeResult of a benched route's background probe."""
    return f"{PREFIX}.endpoint.{token(endpoint)}.probe_result"


def chain_resolve(name: str) -> str:
    """Request/reply: ChainGet -> ChainState."""
    return f"{PREFIX}.chain.{token(name)}.resolve"


def chain_edit(name: str) -> str:
    """Request/reply: ChainEdit -> ChainState | ErrorReply."""
    return f"{PREFIX}.chain.{token(name)}.edit"


def chain_state(name: str) -> str:
    """Event: ChainState, published by the ChainActor on every change."""
    return f"{PREFIX}.chain.{token(name)}.state"


HEALTH_DEEP = f"{PREFIX}.health.deep"
CHAIN_STATE_ANY = f"{PREFIX}.chain.*.state"
CHAIN_RESOLVE_ANY = f"{PREFIX}.chain.*.resolve"
STEERING_GET = f"{PREFIX}.steering.get"
STEERING_CHECK = f"{PREFIX}.steering.check"
STEERING_STATE = f"{PREFIX}.steering.state"
STEERING_EVIDENCE = f"{PREFIX}.steering.evidence"
PROBE_DUE = f"{PREFIX}.probe.due"
MODE_GET = f"{PREFIX}.mode.get"
RULES_GET = f"{PREFIX}.rules.get"
RULES_STATE = f"{PREFIX}.rules.state"
ROUTEWISE_SETTINGS = f"{PREFIX}.routewise.settings"
ROUTEWISE_SETTINGS_GET = f"{PREFIX}.routewise.settings.get"
ROUTEWISE_PROBE_DUE = f"{PREFIX}.routewise.probe"
OBSERVATION_ANY = f"{PREFIX}.obs.*"
ENDPOINT_STATE_ANY = f"{PREFIX}.endpoint.*.state"
EVENTS_ANY = f"{PREFIX}.events.>"
EVENTS_STREAM = "LLMGW_EVENTS"  # the kept history of llmgw.events.> (Bus.replay's stream)
REQUEST_DONE_ANY = f"{PREFIX}.request.*.done"
LOG_APPEND = f"{PREFIX}.log.append"
ADMIN_ANY = f"{PREFIX}.admin.>"
SUPERVISOR_EVENTS_ANY = f"{PREFIX}.sys.supervisor.*.event"
KEYPOOL_STATE_ANY = f"{PREFIX}.keypool.*.state"
KEYS_REGISTRY_GET = f"{PREFIX}.keys.registry.get"
KEYS_DECLARATIONS = f"{PREFIX}.keys.registry.declarations"
KEYS_SECRET_GRANT = f"{PREFIX}.keys.registry.secret"
AUTH_KEYS_CHANGED = f"{PREFIX}.auth.keys.changed"
AUTH_KEYS_LOOKUP = f"{PREFIX}.auth.keys.lookup"
AUTH_STATE_GET = f"{PREFIX}.auth.state.get"
AUTH_STATE = f"{PREFIX}.auth.state"
DASHBOARD_SESSION_ENDED = f"{PREFIX}.dashboard.session.ended"
LIMITS_ADMIT = f"{PREFIX}.limits.admit"
LIMITS_SETTLE = f"{PREFIX}.limits.settle"
LIMITS_RENEW = f"{PREFIX}.limits.renew"
LIMITS_GET = f"{PREFIX}.limits.get"
LIMITS_STATE = f"{PREFIX}.limits.state"


def capacity_acquire(pool: str) -> str:
    """Request/reply: CapacityAcquire -> CapacityGrant."""
    return f"{PREFIX}.capacity.{token(pool)}.acquire"


def capacity_renew(pool: str) -> str:
    """Event: CapacityRenew (the ingress keeps its leases alive)."""
    return f"{PREFIX}.capacity.{token(pool)}.renew"


def capacity_release(pool: str) -> str:
    """Event: CapacityRelease (a lease given back)."""
    return f"{PREFIX}.capacity.{token(pool)}.release"


def capacity_get(pool: str) -> str:
    """Request/reply: CapacityGet -> CapacityState."""
    return f"{PREFIX}.capacity.{token(pool)}.get"


def capacity_state(pool: str) -> str:
    """Event: CapacityState, on every change of a pool's count."""
    return f"{PREFIX}.capacity.{token(pool)}.state"


def capacity_reading(pool: str) -> str:
    """Event: QuotaReading (an http_json quota source's poll, for the pool's owner)."""
    return f"{PREFIX}.capacity.{token(pool)}.reading"


CAPACITY_STATE_ANY = f"{PREFIX}.capacity.*.state"
