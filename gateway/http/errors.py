"""The one table from error to HTTP status, and the headers (``Retry-After``) an error answer
carries: the ingress's, in each surface's shape, and the local admin socket's alike."""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from schemas import (
    QUOTA_EXHAUSTED,
    BudgetExceededError,
    BusDisconnectedError,
    ErrorCode,
    GatewayError,
    OutcomeUnknownError,
    UnsupportedEncodingError,
    UpstreamError,
)

_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.PIN_NOT_FOUND: 400,
    ErrorCode.CONTENT_FILTER: 400,
    # Not the spec's 503: no route of the model can ever take the request, so retrying it
    # unchanged is in vain.
    ErrorCode.NO_ROUTE_FOR_MODALITY: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.KEY_POOL_ROLE_RESTRICTED: 403,
    ErrorCode.KEY_POOL_EXHAUSTED: 503,
    ErrorCode.ROUTE_NOT_FOUND: 404,
    ErrorCode.REQUEST_TOO_LARGE: 413,
    ErrorCode.UNSUPPORTED_ENCODING: 415,
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.CANCELLED: 499,  # nginx's convention; the client is gone and reads nothing
    ErrorCode.UPSTREAM_RATE_LIMITED: 429,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.BUDGET_EXCEEDED: 429,
    ErrorCode.LIMITS_UNAVAILABLE: 503,
    ErrorCode.INTERNAL: 500,
    ErrorCode.UPSTREAM_ERROR: 502,
    ErrorCode.UPSTREAM_BAD_RESPONSE: 502,
    ErrorCode.ALL_CIRCUITS_OPEN: 503,
    ErrorCode.NO_RESPONDERS: 503,
    ErrorCode.BUS_TIMEOUT: 503,
    ErrorCode.AUTH_BUSY: 503,
    ErrorCode.UPSTREAM_TIMEOUT: 504,
}

# A 503 whose cause does not say when it ends (no actor answers, a bus timeout): about the
# time an actors process takes to restart.
DEFAULT_RETRY_AFTER_S = 5
DEFAULT_RETRY_AFTER = str(DEFAULT_RETRY_AFTER_S).encode()
# An upstream's 429 without a wait it could use: the key pool's own first cooling (1 s).
PACED_RETRY_AFTER = b"1"

# Upstream statuses that describe the client's request; relayed as they are.
REQUEST_DESCRIBING = frozenset({400, 404, 413, 422})
# Anthropic's status for an overloaded API (``overloaded_error``), which its SDKs raise as
# OverloadedError and Claude Code retries as an overload; the OpenAI surfaces have no such
# status and keep the 502, as does an upstream's 503 everywhere (it need not be overload)
# unless its body says it is: Anthropic's error shape with ``overloaded_error`` (Claude
# behind a proxy or another cloud answers its overload so).
OVERLOADED = 529
_OVERLOAD_MARK = b"overloaded_error"


def http_status(err: GatewayError, *, relays_overload: bool = False) -> int:
    """The HTTP status a client sees for ``err``; ``relays_overload``: the caller's API has
    :data:`OVERLOADED` (Anthropic's), which an upstream's overload then is."""
    if isinstance(err, UpstreamError) and err.status is not None:
        if err.status in REQUEST_DESCRIBING or err.status == 429:
            return err.status
        if relays_overload and (err.status == OVERLOADED or _says_overloaded(err)):
            return OVERLOADED
    if isinstance(err, BudgetExceededError):
        return err.status  # 429, or 402 where the operator chose it
    return _STATUS.get(err.code, 500)


def _says_overloaded(err: UpstreamError) -> bool:
    """Whether a 503's body is Anthropic's error shape of type ``overloaded_error``."""
    if err.status != 503 or _OVERLOAD_MARK not in err.body:
        return False
    inner = _error_object(err.body)
    return inner is not None and inner.get("type") == "overloaded_error"


def _error_object(body: bytes) -> dict[str, Any] | None:
    """The ``error`` object of an upstream's JSON error body, or None."""
    try:
        decoded = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    inner = decoded.get("error") if isinstance(decoded, dict) else None
    return inner if isinstance(inner, dict) else None


def error_code(err: GatewayError) -> str:
    """The machine-readable ``code`` of an error answer."""
    if isinstance(err, UpstreamError) and err.status == 429:
        return ErrorCode.UPSTREAM_RATE_LIMITED.value
    return err.code.value


# An upstream's own OpenAI error ``code`` is an identifier (``context_length_exceeded``,
# ``invalid_value``), never prose, nor a redacted body's ``[redacted]``; its ``param`` a
# request field's path (``messages[1].content``, ``tools[0].function.name``).
_UPSTREAM_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
_UPSTREAM_PARAM = re.compile(r"[A-Za-z_][A-Za-z0-9_.\[\]-]{0,99}")


def _relayed_field(err: GatewayError, key: str) -> str | None:
    """``key`` of the upstream's own OpenAI ``error`` object, when ``err`` is an upstream's
    refusal of the request relayed as it is (a 400, 404, 413, 422) and it is a string."""
    if not (isinstance(err, UpstreamError) and err.status in REQUEST_DESCRIBING and err.body):
        return None
    inner = _error_object(err.body)
    value = inner.get(key) if inner is not None else None
    return value if isinstance(value, str) else None


_CONTEXT_MARKERS = (
    b"context_length_exceeded",
    b"maximum context length",
    b"context window",
    b"prompt is too long",  # Anthropic
    b"too many tokens",
    b"input is too long",  # Bedrock
    b"exceeds the maximum number of tokens",  # Gemini
)
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


def is_context_refusal(err: UpstreamError) -> bool:
    """Whether the upstream refused the prompt as longer than its context window."""
    if err.status not in (400, 413, 422):
        return False
    text = err.body.lower() + err.message.lower().encode()
    return any(marker in text for marker in _CONTEXT_MARKERS)


def client_code(err: GatewayError) -> str:
    """The ``code`` a client's error answer shows: :func:`error_code`, but for an upstream's
    refusal of the request relayed as it is (a 400, 404, 413, 422), the upstream's own OpenAI
    ``error.code`` when it gave one: what clients act on (Codex compacts its history on
    ``context_length_exceeded``), as they would calling the provider; and OpenAI's
    ``context_length_exceeded`` for another provider's refusal of a prompt longer than its
    context window (Claude's ``prompt is too long``), which gives no such code."""
    code = _relayed_field(err, "code")
    if code is not None and _UPSTREAM_CODE.fullmatch(code):
        return code
    if isinstance(err, UpstreamError) and is_context_refusal(err):
        return CONTEXT_LENGTH_EXCEEDED
    return error_code(err)


def error_param(err: GatewayError) -> str | None:
    """The request field an error is about, when it is about one."""
    # InvalidRequestError, and upstream refusals that name a field (UnsupportedParameterError).
    param = getattr(err, "param", None)
    return param if isinstance(param, str) else None


def client_param(err: GatewayError) -> str | None:
    """The ``param`` a chat client's error answer shows: :func:`error_param`, else
    :func:`relayed_param`: it names the chat request the client sent (other surfaces' were
    translated)."""
    param = error_param(err)
    return relayed_param(err) if param is None else param


def relayed_param(err: GatewayError) -> str | None:
    """The upstream's own OpenAI ``error.param`` of a refusal relayed as it is, when it is a
    field's path and ``err`` names none of its own (it names the canonical chat request)."""
    if error_param(err) is not None:
        return None
    relayed = _relayed_field(err, "param")
    return relayed if relayed is not None and _UPSTREAM_PARAM.fullmatch(relayed) else None


def client_message(err: GatewayError) -> str:
    """The message a client reads: the error's own, except that the control plane being
    unreachable is told as what the client can do about it (retry; check first when a
    command's outcome is unknown), never as the bus subject and timeout the bus reported."""
    if err.code in (ErrorCode.NO_RESPONDERS, ErrorCode.BUS_TIMEOUT):
        seconds = retry_after_header(err) or DEFAULT_RETRY_AFTER
        if isinstance(err, OutcomeUnknownError):  # not "retry": it may have been applied
            return f"{err.message}; the bus may be back in {seconds.decode()} s"
        what = (
            "has lost its connection to its message bus (reconnecting)"
            if isinstance(err, BusDisconnectedError)
            else "'s routing service is not answering (restarting or down)"
        )
        return f"the gateway{what}; retry in {seconds.decode()} s"
    return err.message


def retry_after_header(err: GatewayError) -> bytes | None:
    """``Retry-After`` in whole seconds (rounded up, at least 1) when the error has one; for
    a 503 without one, :data:`DEFAULT_RETRY_AFTER_S` (a 503 always says when to come back);
    for an upstream's 429 that gave no usable wait, :data:`PACED_RETRY_AFTER` (a pace, not
    a spent quota: worth trying again soon)."""
    if err.retry_after is not None:
        return str(max(1, math.ceil(err.retry_after))).encode()
    status = http_status(err)
    if status == 503:
        return DEFAULT_RETRY_AFTER
    if status == 429 and isinstance(err, UpstreamError) and err.kind != QUOTA_EXHAUSTED:
        return PACED_RETRY_AFTER
    return None


# The official SDKs retry a 429 (and a 5xx) unless ``x-should-retry: false`` says not to, and
# wait out a ``Retry-After`` of at most this long; a longer one they replace by their own
# backoff of a second or two.
SDK_RETRY_AFTER_CAP_S = 60
_NO_RETRY = (b"x-should-retry", b"false")


def error_headers(err: GatewayError) -> list[tuple[bytes, bytes]]:
    """The headers of an answer to ``err`` (beside the ``x-request-id`` every answer has):
    ``Retry-After`` when :func:`retry_after_header` gives one, ``x-should-retry: false``
    when retrying soon is in vain: a spent budget whose next period is further away than an
    SDK waits, or an upstream's spent quota (its SDK retried at once, twice, each refused);
    ``Accept-Encoding`` with the body encodings taken, for one it does not (RFC 7694)."""
    retry = retry_after_header(err)
    headers = [] if retry is None else [(b"retry-after", retry)]
    if isinstance(err, UnsupportedEncodingError):
        headers.append((b"accept-encoding", b"gzip, deflate"))
    elif isinstance(err, BudgetExceededError):
        if err.retry_after is None or err.retry_after > SDK_RETRY_AFTER_CAP_S:
            headers.append(_NO_RETRY)
    elif isinstance(err, UpstreamError) and err.status == 429 and err.kind == QUOTA_EXHAUSTED:
        headers.append(_NO_RETRY)
    return headers
