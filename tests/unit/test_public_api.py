"""The public API of every package: each ``__init__``'s ``__all__``, pinned.

A package's ``__all__`` is what other packages may import from it (STYLE.md: import a
package's public names from its ``__init__``). Changing it is a decision, so this table must
change with it, in the same commit. Every package under the four roots must be listed here,
so a new package gets an ``__all__`` (empty when its modules are imported by name) on purpose.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("schemas", "bus", "actors", "gateway")

PINNED: dict[str, list[str]] = {
    "schemas": [
        "AdminCommand",
        "AdminExecuted",
        "AdminReply",
        "AdmitBatch",
        "AdmitBatchReply",
        "AdmitReply",
        "AdmitRequest",
        "AllCircuitsOpenError",
        "AllRoutesCoolingError",
        "ApiKeyCreated",
        "ApiKeyInfo",
        "ApiKeyLookup",
        "ApiKeyRevoked",
        "AuthBusyError",
        "AuthRejected",
        "AuthState",
        "AuthStateRequest",
        "BenchChanged",
        "BodyTimeoutError",
        "BudgetExceededError",
        "BudgetThreshold",
        "BusDisconnectedError",
        "BusTimeoutError",
        "CapacityAcquire",
        "CapacityGet",
        "CapacityGrant",
        "CapacityRelease",
        "CapacityRenew",
        "CapacityState",
        "ChainEdit",
        "ChainEntry",
        "ChainGet",
        "ChainModels",
        "ChainModelsDropped",
        "ChainState",
        "ChainsCheck",
        "ChainsChecked",
        "ChildFailed",
        "ChildRestarted",
        "ChildStarted",
        "CircuitTransition",
        "ClientClosedError",
        "ConfigChanged",
        "ContentFilteredError",
        "DashboardSessionEnded",
        "EndpointState",
        "ErrorCode",
        "ErrorReply",
        "Evidence",
        "FirstToken",
        "ForbiddenError",
        "GatewayError",
        "Guardrails",
        "HEDGE_DECLINED",
        "HealthReport",
        "HealthRequest",
        "HostAlive",
        "InvalidRequestError",
        "KeyAcquire",
        "KeyCooling",
        "KeyDeclarations",
        "KeyDeclarationsRequest",
        "KeyGrant",
        "KeyMuted",
        "KeyPoolExhaustedError",
        "KeyPoolRoleRestrictedError",
        "KeyPoolState",
        "KeyPoolStateRequest",
        "KeyUnmuted",
        "LatencyProbeDue",
        "LatencySample",
        "LeaseExpired",
        "LimitRenew",
        "LimitSettle",
        "LimitSettleBatch",
        "LimitsGet",
        "LimitsState",
        "LimitsUnavailableError",
        "LocalHealth",
        "LogAppend",
        "LogAppended",
        "Message",
        "ModeChanged",
        "ModeRequest",
        "ModelBreakerTripped",
        "ModelEvidence",
        "ModelStatus",
        "ModelStatusRequest",
        "NoRespondersError",
        "NoRouteForModalityError",
        "Observation",
        "ObservationBatch",
        "OutcomeUnknownError",
        "PinNotFoundError",
        "PoolKey",
        "ProbeDue",
        "ProbeFirstByte",
        "ProbeGrant",
        "ProbeRequest",
        "ProbeResult",
        "ProviderKeyDecl",
        "ProviderSecretGrant",
        "ProviderSecretRequest",
        "QUOTA_EXHAUSTED",
        "QuotaReading",
        "QuotaSourceStatus",
        "RATE_LIMIT_EXCEEDED",
        "READ_ONLY_ADMIN_VERBS",
        "RateLimitedError",
        "RequestCompleted",
        "RequestTooLargeError",
        "RouteBatch",
        "RouteBatchReply",
        "RouteCandidate",
        "RouteCapacity",
        "RouteDecided",
        "RouteNotFoundError",
        "RoutePlan",
        "RouteRequest",
        "RouteSkip",
        "RouteStatus",
        "RouteWiseCandidate",
        "RouteWiseSettings",
        "RouteWiseSettingsGet",
        "Rule",
        "RulesGet",
        "RulesState",
        "SetWeight",
        "StateRequest",
        "SteeringGet",
        "SteeringSnapshot",
        "SteeringState",
        "SupervisorGaveUp",
        "UnauthorizedError",
        "UnsupportedEncodingError",
        "UpstreamBadResponseError",
        "UpstreamError",
        "UpstreamTimeoutError",
        "error_from_reply",
        "is_backpressure",
        "is_read_only_admin_verb",
        "priced_tokens",
        "raise_for_reply",
        "subjects",
    ],
    "bus": [
        "Bus",
        "BusClosedError",
        "CodecError",
        "Envelope",
        "InProcessBus",
        "KeyValue",
        "KvConflictError",
        "KvEntry",
        "Mailbox",
        "NatsBus",
        "NoRespondersError",
        "RequestTimeoutError",
        "Subscription",
        "decode",
        "decode_reply",
        "encode",
        "open_bus",
    ],
    "actors.cluster": [
        "ClusterConfigActor",
        "ClusterHost",
        "FencedSnapshots",
        "HOSTS_BUCKET",
        "Lease",
        "Membership",
        "OWNERS_BUCKET",
        "Owners",
        "SNAPSHOTS_BUCKET",
        "owner_of",
    ],
    "actors": [
        "Actor",
        "ActorContext",
        "AdminArea",
        "Cancellable",
        "CapacityActor",
        "ChildSpec",
        "ConfigActor",
        "ConfigState",
        "EndpointActor",
        "HealthActor",
        "ModelActor",
        "MovedKeys",
        "Restart",
        "Serve",
        "SnapshotStore",
        "StoreActor",
        "Strategy",
        "Supervisor",
        "SupervisorGaveUpError",
        "build_tree",
        "move_provider_keys",
    ],
    "actors.strategies": [
        "ProbeTick",
        "RouteView",
        "RoutingStrategy",
        "StartupProblemError",
        "StrategyDeps",
        "StrategyHost",
        "StrategyParams",
        "build_strategy",
        "known_strategies",
        "register_missing_strategy",
        "register_strategy",
        "startup_problem",
        "strategy_serves",
        "validate_strategy",
    ],
    "actors.strategies.routewise": [
        "Candidate",
        "RESOURCE_KEYS",
        "RouteWiseParams",
        "RouteWiseStrategy",
        "reference_pricing",
        "startup_problem",
    ],
    "gateway": [],
    "gateway.adapters": [
        "DEFAULT_MAX_TOKENS",
        "MessagesToChatStream",
        "UpstreamStreamError",
        "anthropic_wire",
        "from_messages_response",
        "to_messages_request",
    ],
    "gateway.dashboard": [
        "Dashboard",
        "Session",
        "SessionSigner",
    ],
    "gateway.formats": [
        "ChatToMessagesStream",
        "ChatToResponsesStream",
        "anthropic_messages",
        "openai_responses",
    ],
    "gateway.http": [],
    "gateway.ingress": [],
    "gateway.steering": [],
    "gateway.telemetry": ["start_telemetry"],
    "gateway.auth": [],
    "gateway.admin": [],
    "gateway.process": [],
    "gateway.process.h1": [],
    "gateway.cli": [],
    "gateway.replay": [],
    "actors.state": [],
    "actors.stores": [],
}


def _packages() -> list[str]:
    """Every package under the roots, as a dotted name (``gateway.adapters``)."""
    found = []
    for root in ROOTS:
        for init in sorted((REPO / root).rglob("__init__.py")):
            found.append(".".join(init.parent.relative_to(REPO).parts))
    return found


def test_every_package_is_pinned() -> None:
    missing = sorted(set(_packages()) - set(PINNED))
    assert not missing, f"add these packages and their __all__ to PINNED: {missing}"
    gone = sorted(set(PINNED) - set(_packages()))
    assert not gone, f"these pinned packages no longer exist: {gone}"


@pytest.mark.parametrize("package", sorted(PINNED))
def test_package_all_is_pinned(package: str) -> None:
    module = importlib.import_module(package)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{package}/__init__.py defines no __all__"
    assert len(exported) == len(set(exported)), f"{package}.__all__ repeats a name"
    added = sorted(set(exported) - set(PINNED[package]))
    removed = sorted(set(PINNED[package]) - set(exported))
    assert (added, removed) == ([], []), (
        f"{package}.__all__ changed: added {added}, removed {removed}; "
        "update PINNED in tests/unit/test_public_api.py if that is intended"
    )


@pytest.mark.parametrize("package", sorted(PINNED))
def test_every_public_name_exists(package: str) -> None:
    module = importlib.import_module(package)
    absent = [name for name in PINNED[package] if not hasattr(module, name)]
    assert not absent, f"{package}.__all__ names what it does not define: {absent}"


def test_pinned_lists_are_sorted() -> None:
    unsorted = [p for p, names in PINNED.items() if names != sorted(names)]
    assert not unsorted, f"keep each pinned list sorted (easier merges): {unsorted}"
