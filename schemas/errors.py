"""The gateway's error hierarchy, its stable codes, and the wire form of an error reply."""

from __future__ import annotations

import enum
from typing import ClassVar, TypeVar

import msgspec

_T = TypeVar("_T")


class ErrorCode(enum.StrEnum):
    """Machine-readable error codes; ``gateway/http/errors.py`` maps each to an HTTP status."""

    INVALID_REQUEST = "invalid_request"
    ROUTE_NOT_FOUND = "route_not_found"
    ALL_CIRCUITS_OPEN = "all_circuits_open"
    NO_ROUTE_FOR_MODALITY = "no_route_for_modality"
    PIN_NOT_FOUND = "pin_not_found"
    UPSTREAM_ERROR = "upstream_error"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    UPSTREAM_RATE_LIMITED = "upstream_rate_limited"
    UPSTREAM_BAD_RESPONSE = "upstream_bad_response"
    CONTENT_FILTER = "content_filter"
    NO_RESPONDERS = "no_responders"
    BUS_TIMEOUT = "bus_timeout"
    REQUEST_TOO_LARGE = "request_too_large"
    UNSUPPORTED_ENCODING = "unsupported_encoding"
    REQUEST_TIMEOUT = "request_timeout"
    CANCELLED = "cancelled"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    AUTH_BUSY = "auth_busy"
    KEY_POOL_EXHAUSTED = "key_pool_exhausted"
    KEY_POOL_ROLE_RESTRICTED = "key_pool_role_restricted"
    RATE_LIMITED = "rate_limited"
    BUDGET_EXCEEDED = "budget_exceeded"
    LIMITS_UNAVAILABLE = "limits_unavailable"
    INTERNAL = "internal"


class ErrorReply(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Wire form of a GatewayError answered over the bus."""

    code: str
    message: str
    retryable: bool = False
    retry_after: float | None = None
    param: str | None = None
    cooling: bool = False


class GatewayError(Exception):
    """Root of every error the gateway turns into a client-visible answer."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    def to_reply(self) -> ErrorReply:
        """Render this error for the bus."""
        return ErrorReply(
            code=self.code.value,
            message=self.message,
            retryable=self.retryable,
            retry_after=self.retry_after,
            param=getattr(self, "param", None),
        )


class InvalidRequestError(GatewayError):
    """The client's request is malformed; ``param`` names the offending field."""

    code = ErrorCode.INVALID_REQUEST

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class RequestTooLargeError(GatewayError):
    """The request body is over the configured limit."""

    code = ErrorCode.REQUEST_TOO_LARGE


class UnsupportedEncodingError(GatewayError):
    """The request body's ``Content-Encoding`` is one the gateway does not decode."""

    code = ErrorCode.UNSUPPORTED_ENCODING


class BodyTimeoutError(GatewayError):
    """The request body did not arrive within ``server.body_timeout_seconds``."""

    code = ErrorCode.REQUEST_TIMEOUT


class ClientClosedError(GatewayError):
    """The client went away before its answer began (its body cut short, or while its
    request was routed or served): no one reads an answer, and the request log counts it
    with the other requests the client left (499)."""

    code = ErrorCode.CANCELLED


class RouteNotFoundError(GatewayError):
    """No published model (or alias) has this id."""

    code = ErrorCode.ROUTE_NOT_FOUND


class AllCircuitsOpenError(GatewayError):
    """Every route of the model is refusing traffic; ``retry_after`` says when to come back."""

    code = ErrorCode.ALL_CIRCUITS_OPEN
    retryable = True


class AllRoutesCoolingError(AllCircuitsOpenError):
    """Every route of the model is cooling after its provider's 429 (back-pressure, not
    sickness): ``retry_after`` is the earliest reset, which a request may wait for. The
    client sees it as AllCircuitsOpenError."""

    def to_reply(self) -> ErrorReply:
        return msgspec.structs.replace(super().to_reply(), cooling=True)


class NoRouteForModalityError(GatewayError):
    """No route of the model accepts the request's input modalities: the caller's request
    must change (a 400, not the spec's retryable 503)."""

    code = ErrorCode.NO_ROUTE_FOR_MODALITY


class PinNotFoundError(GatewayError):
    """An ``X-Route-Pin`` names no route of the model."""

    code = ErrorCode.PIN_NOT_FOUND


class UnauthorizedError(GatewayError):
    """The caller presented no valid gateway credential."""

    code = ErrorCode.UNAUTHORIZED


class ForbiddenError(GatewayError):
    """The caller is known but its role may not do this (e.g. a non-admin key on /admin)."""

    code = ErrorCode.FORBIDDEN


class AuthBusyError(GatewayError):
    """This ingress already waits on as many key lookups as it allows; the key was not
    judged (it may well be valid), so the caller retries after ``retry_after``."""

    code = ErrorCode.AUTH_BUSY
    retryable = True


class NoRespondersError(GatewayError):
    """Nobody serves the subject a request was sent to (the control plane is not running)."""

    code = ErrorCode.NO_RESPONDERS
    retryable = True


class BusDisconnectedError(NoRespondersError):
    """This process lost its connection to the bus (NATS) and is reconnecting: nothing it
    asks can be heard until it is back (a 503 the caller retries)."""


class BusTimeoutError(GatewayError):
    """The control plane did not answer in time."""

    code = ErrorCode.BUS_TIMEOUT
    retryable = True


class OutcomeUnknownError(BusTimeoutError):
    """This process lost its connection to the bus while a command waited for its reply,
    and it was not back in time: unlike BusDisconnectedError (not sent), the command may
    have reached its owner and been applied, so the caller checks before sending it again."""


class UpstreamError(GatewayError):
    """An upstream attempt failed; ``status`` is its HTTP status (None: no answer at all).

    ``counts_against_endpoint`` says whether the failure says the endpoint is sick (timeouts,
    refused connections, 408/429/5xx, garbage) as opposed to the caller's request being bad.
    """

    code = ErrorCode.UPSTREAM_ERROR
    usage: dict[str, object] | None = None
    """What the upstream reported it used on an answer it billed that the gateway could not
    hand on (chat shape, an :class:`UnusableAnswerError`'s); None: nothing known."""

    def __init__(
        self,
        message: str,
        *,
        endpoint: str = "",
        status: int | None = None,
        body: bytes = b"",
        retry_after: float | None = None,
        kind: str = "http_error",
    ) -> None:
        super().__init__(message, retry_after=retry_after)
        self.endpoint = endpoint
        # Only an int: an upstream's ``"code": true`` taken for one made an observation that
        # no bus could carry, which held back every request-log row after it.
        self.status = status if type(status) is int else None
        self.body = body
        self.kind = kind

    @property
    def counts_against_endpoint(self) -> bool:
        """True when the failure is the endpoint's, not the caller's."""
        if self.status is None:
            return True
        return self.status in (401, 407, 408, 429) or self.status >= 500

    @property
    def is_auth_rejection(self) -> bool:
        """True for a 401/407: the upstream refused our credential."""
        return self.status in (401, 407)


class UpstreamTimeoutError(UpstreamError):
    """The upstream did not answer (or stopped answering) in time."""

    code = ErrorCode.UPSTREAM_TIMEOUT


class UpstreamBadResponseError(UpstreamError):
    """The upstream answered something that is not a valid answer of its API."""

    code = ErrorCode.UPSTREAM_BAD_RESPONSE


class UnusableAnswerError(UpstreamBadResponseError):
    """The model answered this request with nothing to hand on: it stopped with no text and
    no tool call, or its answer ended broken (a malformed or unexpected tool call, malformed
    output: Gemini's ``MALFORMED_FUNCTION_CALL``, Bedrock's ``malformed_tool_use``). The next
    route is tried and, when none answers, the caller gets the 502. Never the endpoint's
    failure: the request's conversation and tools are what make a model answer so, some of
    them every time, and one caller's request must not bench the route or open its circuit
    for every caller."""

    @property
    def counts_against_endpoint(self) -> bool:
        """Never: the endpoint answered; the model had nothing usable to say to this request."""
        return False


class ContentFilteredError(UpstreamError):
    """The upstream's content filter refused the prompt (Azure's ``content_filter`` 400).

    It is the caller's request, not the endpoint's failure: it never counts against the
    route, and no other route is tried with the same prompt. ``status`` is the upstream's.
    """

    code = ErrorCode.CONTENT_FILTER

    @property
    def counts_against_endpoint(self) -> bool:
        """Never: the endpoint judged the prompt, it is not sick."""
        return False


class KeyPoolExhaustedError(UpstreamError):
    """Every upstream key this caller may spend on a route is muted (or it may spend none).

    Nothing was sent upstream. ``retry_after`` is when the first of those keys unmutes.
    """

    code = ErrorCode.KEY_POOL_EXHAUSTED
    retryable = True


class KeyPoolRoleRestrictedError(KeyPoolExhaustedError):
    """A refusal caused only by reservation: the pool still serves higher roles, so it is
    not the endpoint's failure and is never charged to its health."""

    code = ErrorCode.KEY_POOL_ROLE_RESTRICTED

    @property
    def counts_against_endpoint(self) -> bool:
        """Never: the endpoint is serving the tiers that own its keys."""
        return False


class RateLimitedError(GatewayError):
    """The caller's own limit (rpm, tpm, concurrency of its key, user or organisation) is
    reached; ``retry_after`` says when the window admits the request. Never an endpoint's
    failure: nothing was sent upstream."""

    code = ErrorCode.RATE_LIMITED
    retryable = True


class BudgetExceededError(GatewayError):
    """The caller's budget for the current period is spent; ``retry_after``: until the next
    period starts. ``status`` is 429 or, by setting, 402."""

    code = ErrorCode.BUDGET_EXCEEDED

    def __init__(
        self, message: str, *, retry_after: float | None = None, status: int = 429
    ) -> None:
        super().__init__(message, retry_after=retry_after)
        self.status = status


class LimitsUnavailableError(GatewayError):
    """The owner of the caller's limits did not answer within the decision timeout and the
    gateway fails closed: the request is refused rather than counted nowhere."""

    code = ErrorCode.LIMITS_UNAVAILABLE
    retryable = True


_BY_CODE: dict[str, type[GatewayError]] = {
    cls.code.value: cls
    for cls in (
        AuthBusyError,
        InvalidRequestError,
        RequestTooLargeError,
        BodyTimeoutError,
        ClientClosedError,
        RouteNotFoundError,
        AllCircuitsOpenError,
        NoRouteForModalityError,
        PinNotFoundError,
        UnauthorizedError,
        NoRespondersError,
        BusTimeoutError,
        UpstreamError,
        UpstreamTimeoutError,
        UpstreamBadResponseError,
        ContentFilteredError,
        ForbiddenError,
        KeyPoolExhaustedError,
        KeyPoolRoleRestrictedError,
        RateLimitedError,
        BudgetExceededError,
        LimitsUnavailableError,
    )
}


def error_from_reply(reply: ErrorReply) -> GatewayError:
    """Turn an ErrorReply back into its GatewayError class (GatewayError when unknown)."""
    cls = _BY_CODE.get(reply.code, GatewayError)
    if reply.cooling:
        return AllRoutesCoolingError(reply.message, retry_after=reply.retry_after)
    if cls is GatewayError:
        return GatewayError(reply.message, retry_after=reply.retry_after)
    if issubclass(cls, UpstreamError):
        return cls(reply.message, retry_after=reply.retry_after)
    if cls is InvalidRequestError:
        return InvalidRequestError(reply.message, param=reply.param)
    return cls(reply.message, retry_after=reply.retry_after)


def raise_for_reply(reply: _T | ErrorReply) -> _T:
    """Return ``reply`` unless it is an ErrorReply, which is raised as its GatewayError."""
    if isinstance(reply, ErrorReply):
        raise error_from_reply(reply)
    return reply
