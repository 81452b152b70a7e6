"""Everything that crosses the bus: message structs, subject names, errors.

``Message`` is the tagged union of every struct on the bus; the codec decodes into it.
"""

from __future__ import annotations

from typing import Union

from schemas import subjects
from schemas.errors import (
    AllCircuitsOpenError,
    BusTimeoutError,
    ErrorCode,
    ErrorReply,
    GatewayError,
    InvalidRequestError,
    NoRespondersError,
    NoRouteForModalityError,
    PinNotFoundError,
    RequestTooLargeError,
    RouteNotFoundError,
    UnauthorizedError,
    UpstreamBadResponseError,
    UpstreamError,
    UpstreamTimeoutError,
    error_from_reply,
    raise_for_reply,
)
from schemas.events import (
    AuthRejected,
    ChildFailed,
    ChildRestarted,
    ChildStarted,
    CircuitTransition,
    SupervisorGaveUp,
)
from schemas.routing import (
    EndpointState,
    HealthReport,
    HealthRequest,
    ModelStatus,
    ModelStatusRequest,
    Observation,
    ProbeGrant,
    ProbeRequest,
    RouteCandidate,
    RoutePlan,
    RouteRequest,
    RouteStatus,
    StateRequest,
)

Message = Union[  # noqa: UP007 - a runtime union that msgspec decodes by tag
    RouteRequest,
    RoutePlan,
    Observation,
    EndpointState,
    StateRequest,
    ProbeRequest,
    ProbeGrant,
    HealthRequest,
    HealthReport,
    ModelStatusRequest,
    ModelStatus,
    CircuitTransition,
    AuthRejected,
    ChildStarted,
    ChildFailed,
    ChildRestarted,
    SupervisorGaveUp,
    ErrorReply,
]

__all__ = [
    "AllCircuitsOpenError",
    "AuthRejected",
    "BusTimeoutError",
    "ChildFailed",
    "ChildRestarted",
    "ChildStarted",
    "CircuitTransition",
    "EndpointState",
    "ErrorCode",
    "ErrorReply",
    "GatewayError",
    "HealthReport",
    "HealthRequest",
    "InvalidRequestError",
    "Message",
    "ModelStatus",
    "ModelStatusRequest",
    "NoRespondersError",
    "NoRouteForModalityError",
    "Observation",
    "PinNotFoundError",
    "ProbeGrant",
    "ProbeRequest",
    "RequestTooLargeError",
    "RouteCandidate",
    "RouteNotFoundError",
    "RoutePlan",
    "RouteRequest",
    "RouteStatus",
    "StateRequest",
    "SupervisorGaveUp",
    "UnauthorizedError",
    "UpstreamBadResponseError",
    "UpstreamError",
    "UpstreamTimeoutError",
    "error_from_reply",
    "raise_for_reply",
    "subjects",
]
