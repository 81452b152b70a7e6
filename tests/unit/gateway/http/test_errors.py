"""The error table: every 503 the gateway renders carries ``Retry-After``."""

from __future__ import annotations

import pytest

from gateway.http.errors import (
    DEFAULT_RETRY_AFTER,
    PACED_RETRY_AFTER,
    client_code,
    error_headers,
    http_status,
    retry_after_header,
)
from schemas import (
    QUOTA_EXHAUSTED,
    BudgetExceededError,
    ErrorCode,
    ErrorReply,
    GatewayError,
    RateLimitedError,
    UpstreamError,
)
from schemas.errors import error_from_reply

_ERRORS = [error_from_reply(ErrorReply(code=code.value, message="x")) for code in ErrorCode]
_UNAVAILABLE = [err for err in _ERRORS if http_status(err) == 503]


def test_the_table_has_503s_to_check() -> None:
    assert {err.code for err in _UNAVAILABLE} >= {ErrorCode.NO_RESPONDERS, ErrorCode.BUS_TIMEOUT}


@pytest.mark.parametrize("err", _UNAVAILABLE, ids=lambda e: e.code.value)
def test_every_503_without_a_known_end_says_the_default_retry_after(err: GatewayError) -> None:
    assert retry_after_header(err) == DEFAULT_RETRY_AFTER


def test_a_503_with_a_known_end_says_that_end_rounded_up() -> None:
    err = error_from_reply(ErrorReply(code="all_circuits_open", message="x", retry_after=2.1))
    assert retry_after_header(err) == b"3"


@pytest.mark.parametrize("code", ["invalid_request", "route_not_found", "upstream_error"])
def test_errors_that_are_not_503_carry_no_retry_after_of_their_own(code: str) -> None:
    assert retry_after_header(error_from_reply(ErrorReply(code=code, message="x"))) is None


def test_an_upstreams_429_without_a_usable_wait_still_says_when_to_retry() -> None:
    # The relayed 429 carried no Retry-After when the provider's was malformed or absent.
    paced = UpstreamError("slow down", endpoint="m:a", status=429, kind="http_429")
    spent = UpstreamError("no quota", endpoint="m:a", status=429, kind=QUOTA_EXHAUSTED)

    assert retry_after_header(paced) == PACED_RETRY_AFTER
    assert retry_after_header(spent) is None  # a spent quota does not come back in a second


NO_RETRY = (b"x-should-retry", b"false")


@pytest.mark.parametrize(
    ("err", "in_vain"),
    [
        (BudgetExceededError("spent", retry_after=3600), True),
        (BudgetExceededError("spent"), True),
        (BudgetExceededError("held by running requests", retry_after=30), False),
        (UpstreamError("quota", status=429, kind=QUOTA_EXHAUSTED), True),
        (UpstreamError("slow down", status=429, retry_after=2), False),
        (RateLimitedError("rpm", retry_after=20), False),
        (UpstreamError("down", status=503), False),
    ],
    ids=["budget-hours", "budget-unknown", "budget-soon", "quota", "paced", "rpm", "503"],
)
def test_only_a_refusal_no_sdk_retry_can_change_says_do_not_retry(
    err: GatewayError, in_vain: bool
) -> None:
    assert (NO_RETRY in error_headers(err)) is in_vain


@pytest.mark.parametrize(
    "body",
    [
        b'{"type":"error","error":{"type":"invalid_request_error",'
        b'"message":"prompt is too long: 210000 tokens > 200000 maximum"}}',
        b'{"message":"Input is too long for requested model."}',
        b'{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum '
        b'number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}',
    ],
    ids=["anthropic", "bedrock", "gemini"],
)
def test_a_providers_context_length_refusal_without_openais_code_shows_it(body: bytes) -> None:
    err = UpstreamError("refused", status=400, body=body)

    assert client_code(err) == "context_length_exceeded"


def test_an_upstream_400_that_is_not_about_the_context_keeps_upstream_error() -> None:
    err = UpstreamError("refused", status=400, body=b'{"message":"tools: bad schema"}')

    assert client_code(err) == "upstream_error"
