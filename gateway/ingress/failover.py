"""The failover loop's failure rules, shared by both kinds of attempt, and the seam between the
loop and an attempt.

The rules (what a failed attempt's outcome is, which refusals rule out wider routes or retry
on a spare key, which error a key pool's refusal or a timeout becomes, the tokens a failure
used) run only once an attempt failed, as do two of the loop's steps (a fallback leased right
before it is sent, a key pool's refusal); the loop's state (``Failures``, ``Budget``) is
``dispatch.py``'s. ``AttemptKind`` is what the loop (``dispatch.Dispatcher``) runs per
attempt: a whole answer (``dispatch.ONCE``) or a stream up to its first chunk
(``stream_attempt.STREAM``).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Protocol, TypeVar

from gateway.ingress.settling import NO_USAGE, Usage, shielded, usage_of
from schemas import (
    QUOTA_EXHAUSTED,
    RATE_LIMIT_EXCEEDED,
    ContentFilteredError,
    GatewayError,
    KeyPoolExhaustedError,
    KeyPoolRoleRestrictedError,
    UpstreamError,
    UpstreamTimeoutError,
)

if TYPE_CHECKING:
    from gateway.ingress.dispatch import Budget, Dispatcher, Failures
    from gateway.ingress.hedging import Declined
    from gateway.ingress.request_info import Attempt, RequestInfo
    from schemas import RouteCandidate, RoutePlan

R = TypeVar("R")
P = TypeVar("P", contravariant=True)


class AttemptKind(Protocol[R, P]):
    """One kind of attempt: ``payload`` is what it sends (the operation of a whole answer, the
    body of a stream), ``R`` what a success gives the loop."""

    async def attempt(
        self,
        d: Dispatcher,
        info: RequestInfo,
        payload: P,
        a: Attempt,
        budget: Budget,
        declined: Declined,
        hold: bool,
    ) -> R | UpstreamError:
        """One observed attempt (``hold``: as a side of a hedge race): its success, or the
        error it failed with, its capacity lease given back (a whole answer's success outside
        a race leaves that to ``Served.settle``). Raises only cancellation."""
        ...

    async def discard(self, result: R) -> None:
        """Let go of a success that lost a hedge race."""
        ...


# Failures where the upstream generated nothing: it answered with an error status (its
# rate limit's 429 included), the connection was never made, or the gateway never sent it.
_REFUSED_BEFORE_SENDING = frozenset(
    {"connect", "no_adapter", "unsupported_parameter", RATE_LIMIT_EXCEEDED}
)


def billed_by_failure(err: UpstreamError) -> Usage:
    """The usage a failed attempt's answer reported (one the gateway could not hand on, the
    upstream billed all the same); none reported for every other failure."""
    return NO_USAGE if err.usage is None else usage_of({"usage": err.usage})


def tokens_used_by_failure(err: UpstreamError) -> int | None:
    """The tokens a failed attempt is known to have used, for its lease's release: 0 when
    the upstream refused it before generating (a non-2xx answer, no connection, never sent);
    None when unknown (a timeout, a broken or empty stream, a garbled answer: the upstream
    may have generated, so a token quota keeps the estimate it reserved)."""
    if err.kind.startswith("http_") or err.kind in _REFUSED_BEFORE_SENDING:
        return 0
    return None


def outcome_of(err: UpstreamError) -> str:
    """How an attempt that failed with ``err`` is observed."""
    return "failure" if err.counts_against_endpoint else "client_error"


_KEY_REFUSALS = frozenset({401, 402, 403})


def is_key_refusal(err: UpstreamError) -> bool:
    """Whether the upstream refused the attempt's key rather than the route or the request:
    an authentication or permission refusal, or a spent quota or billing."""
    if isinstance(err, ContentFilteredError):
        return False
    return err.kind == QUOTA_EXHAUSTED or err.status in _KEY_REFUSALS


NO_BACKUP = "hedge_backup_refused"


def no_backup(c: RouteCandidate) -> UpstreamError:
    """A hedge backup whose pool refused its lease: it never ran (not a failure)."""
    return UpstreamError(
        "hedge backup not sent: its capacity pool refused a lease",
        endpoint=c.endpoint,
        kind=NO_BACKUP,
    )


def key_pool_refusal(c: RouteCandidate) -> UpstreamError:
    """The error of a route whose key pool refused the caller (``c.refusal``): nothing was
    sent."""
    cls = (
        KeyPoolRoleRestrictedError
        if c.refusal == KeyPoolRoleRestrictedError.code
        else KeyPoolExhaustedError
    )
    return cls(
        f"no upstream key of {c.endpoint} is available to this caller",
        endpoint=c.endpoint,
        retry_after=c.retry_after,
        kind=c.refusal,
    )


def merged_refusal(errors: list[UpstreamError]) -> UpstreamError:
    """Every route refused for keys: 503 with when one comes back, else 403 (only keys
    reserved above the caller's role exist)."""
    waits = [e.retry_after for e in errors if e.retry_after is not None]
    if waits:
        return KeyPoolExhaustedError(
            "every upstream key available to this caller is muted",
            retry_after=min(waits),
            kind="key_pool_exhausted",
        )
    return KeyPoolRoleRestrictedError(
        "no upstream key of this model is available to your role", kind="key_pool_role_restricted"
    )


def soonest_back(errors: list[UpstreamError]) -> UpstreamError:
    """The primary's answer when every attempt met a rate limit, telling the client when the
    first of those routes is back (the earliest Retry-After among them), not the primary's
    own: the next request would be told that too. One that said nothing cools for the
    gateway's own backoff: the primary's answer is then left as it is."""
    waits = [e.retry_after for e in errors if e.retry_after is not None]
    first = errors[0]
    if len(waits) < len(errors) or first.retry_after == min(waits):
        return first
    shown = copy.copy(first)
    shown.retry_after = min(waits)
    return shown


def unexpected(endpoint: str, exc: Exception) -> tuple[str, UpstreamError]:
    """How an attempt an error other than an upstream's ended is observed (it then reaches
    the client): the caller's own (an adapter refusing the request) as ``client_error``, the
    gateway's own bug as ``cancelled`` of kind ``internal``; neither held against the route."""
    if isinstance(exc, GatewayError):
        return "client_error", UpstreamError(exc.message, endpoint=endpoint, kind=exc.code.value)
    return "cancelled", UpstreamError(
        f"gateway error: {type(exc).__name__}", endpoint=endpoint, kind="internal"
    )


def timed_out(
    c: RouteCandidate, limit: float, by_budget: bool, *, stream: bool
) -> UpstreamTimeoutError:
    """The error of an attempt that had no answer (a stream: no first event) within ``limit``
    (or the budget). Bytes may have come: headers, a body begun, SSE comments such as
    ``: keep-alive``, which are not events."""
    what = "its stream's first event" if stream else "its answer"
    why = "the request's failover budget ran out" if by_budget else f"none in {limit:g} s"
    return UpstreamTimeoutError(
        f"upstream timed out before {what}: {why}",
        endpoint=c.endpoint,
        kind="budget" if by_budget else "ttft",
    )


async def leased_fallback(
    d: Dispatcher, info: RequestInfo, plan: RoutePlan, rest: int, c: RouteCandidate
) -> RouteCandidate | None:
    """``c`` (a fallback, or a retry on a spare key) leased right before it is sent; None
    when its pool refuses (it is given back: never sent, the ModelActor must not count it).
    Stopped while leasing, it gives back the plan's candidates from ``rest`` on (``c``'s, or
    the next after a retry's), as the budget's end does: from the failure before it, the
    ModelActor counts the next candidate as sent. A client's disconnect lands after the
    shielded acquire, in the attempt; a plain ``task.cancel()`` lands here."""
    try:
        leased = await d.leases.acquire(c, info.request_id, info.prompt_estimate)
    except BaseException:
        await shielded(d.settle.give_back_from(info, plan, rest))
        raise
    if leased is None:
        await d.settle.give_back(info, plan.model, c)
    return leased


async def refused(d: Dispatcher, info: RequestInfo, a: Attempt, failures: Failures) -> None:
    """A route whose key pool refused the caller: nothing is sent. A plain exhaustion is the
    endpoint's failure; a reservation-only refusal is not observed at all."""
    err = key_pool_refusal(a.candidate)
    if err.counts_against_endpoint:
        await d.observe(info, a, "failure", d.now(), err=err)
    failures.add(err, a.candidate)
