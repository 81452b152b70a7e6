"""The failover loop's rules, shared by both kinds of attempt, and the seam between the loop and
an attempt.

``Failures`` keeps a request's errors, picks the one the client sees and says which routes a
refusal rules out; ``Budget`` holds the hop cap and the wall-clock budget; ``AttemptKind`` is
what the loop (``dispatch.Dispatcher``) runs per attempt: a whole answer
(``dispatch.ONCE``) or a stream up to its first chunk (``stream_attempt.STREAM``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

import msgspec

from gateway.http.errors import REQUEST_DESCRIBING
from schemas import (
    QUOTA_EXHAUSTED,
    ContentFilteredError,
    KeyPoolExhaustedError,
    KeyPoolRoleRestrictedError,
    UpstreamError,
    UpstreamTimeoutError,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.ingress.dispatch import Dispatcher
    from gateway.ingress.hedging import Declined
    from gateway.ingress.request_info import Attempt, RequestInfo
    from schemas import RouteCandidate
    from schemas.config import FailoverConfig

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
        """One observed attempt (``hold``: as the primary of a hedge race): its success, or the
        error it failed with, its capacity lease given back. Raises only cancellation."""
        ...

    async def discard(self, result: R) -> None:
        """Let go of a success that lost a hedge race."""
        ...


# Failures where the upstream generated nothing: it answered with an error status, the
# connection was never made, or the gateway never sent the request.
_REFUSED_BEFORE_SENDING = frozenset({"connect", "no_adapter", "unsupported_parameter"})


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


_CONTEXT_MARKERS = (
    b"context_length_exceeded",
    b"maximum context length",
    b"context window",
    b"prompt is too long",
    b"too many tokens",
)


def is_context_refusal(err: UpstreamError) -> bool:
    """Whether the upstream refused the prompt as longer than its context window."""
    if err.status not in (400, 413, 422):
        return False
    text = err.body.lower() + err.message.lower().encode()
    return any(marker in text for marker in _CONTEXT_MARKERS)


_KEY_REFUSALS = frozenset({401, 402, 403})


def is_key_refusal(err: UpstreamError) -> bool:
    """Whether the upstream refused the attempt's key rather than the route or the request:
    an authentication or permission refusal, or a spent quota or billing."""
    if isinstance(err, ContentFilteredError):
        return False
    return err.kind == QUOTA_EXHAUSTED or err.status in _KEY_REFUSALS


class Failures:
    """The errors of a request's attempts, which one the client is shown, which remaining
    routes a context-length refusal rules out, and which key a route is retried on when the
    upstream refused the last one's."""

    def __init__(self) -> None:
        self.errors: list[UpstreamError] = []
        self._refused_window: int | None = None
        self._filtered = False
        self._last: tuple[UpstreamError, RouteCandidate] | None = None

    def add(self, err: UpstreamError, c: RouteCandidate) -> None:
        self.errors.append(err)
        self._last = (err, c)
        if isinstance(err, ContentFilteredError):
            # The prompt itself was refused: it is the caller's answer, not another route's job.
            self._filtered = True
        if c.context_window is not None and is_context_refusal(err):
            # A refusal says something about every route no wider than this one.
            self._refused_window = max(self._refused_window or 0, c.context_window)

    def rules_out(self, c: RouteCandidate) -> bool:
        """True for a route whose window is no wider than one that refused the prompt, and
        for every route once a content filter refused it."""
        if self._filtered:
            return True
        refused = self._refused_window
        return refused is not None and c.context_window is not None and c.context_window <= refused

    def rate_limited(self) -> bool:
        """Whether every attempt so far met a provider's rate limit (a 429 that is not a
        quota exhaustion): back-pressure, so each of those routes is cooling."""
        return bool(self.errors) and all(
            e.status == 429 and e.kind != QUOTA_EXHAUSTED for e in self.errors
        )

    def next_key(self, c: RouteCandidate) -> RouteCandidate | None:
        """``c`` on its next spare key when the last failure was ``c``'s and the upstream
        refused its key (one key's problem, not the route's: the same route serves on
        another key, leased anew); else None."""
        last = self._last
        if last is None or not c.spare_credentials:
            return None
        err, failed = last
        if failed.endpoint != c.endpoint or failed.credential_id != c.credential_id:
            return None
        if not is_key_refusal(err):
            return None
        cid, *rest = c.spare_credentials
        return msgspec.structs.replace(
            c, credential_id=cid, spare_credentials=tuple(rest), lease_id="", probe=False
        )

    def final(self) -> UpstreamError:
        if self.errors and all(isinstance(e, KeyPoolExhaustedError) for e in self.errors):
            return merged_refusal(self.errors)
        for err in self.errors:
            if err.status in REQUEST_DESCRIBING:
                return err
        return self.errors[0]


class Budget:
    """One request's hop cap, wall-clock budget and wait for cooling routes
    (``routing.failover``), on ``clock``."""

    __slots__ = ("_clock", "_cooling_left", "_deadline", "_max")

    def __init__(
        self, settings: FailoverConfig, started: float, clock: Callable[[], float]
    ) -> None:
        self._clock = clock
        self._max = settings.max_attempts
        self._deadline = started + settings.budget_seconds if settings.budget_seconds else None
        self._cooling_left = settings.cooling_wait_seconds

    def cooling_wait(self, retry_after: float | None) -> float | None:
        """Seconds to wait for the first cooling route to come back (``retry_after``), taken
        from what is left of the request's ``cooling_wait_seconds``; None when that or the
        budget cannot cover it (the client is then told when to come back)."""
        if retry_after is None or retry_after > self._cooling_left:
            return None
        wait = max(0.0, retry_after)
        if self._deadline is not None and self._clock() + wait >= self._deadline:
            return None
        self._cooling_left -= wait
        return wait

    def may_start(self, attempt: int) -> bool:
        """Whether attempt number ``attempt`` may start now (the first two always may)."""
        if attempt > self._max:
            return False
        return attempt <= 2 or self._deadline is None or self._clock() < self._deadline

    def first_byte_limit(self, attempt: int, own_limit: float, more: bool) -> tuple[float, bool]:
        """Seconds this attempt may wait for its first byte, and whether the budget (not the
        route's own limit) is what bounds it. The budget only cuts an attempt short when
        another route could take over, and never the first retry."""
        if self._deadline is None or attempt == 2 or not more:
            return own_limit, False
        left = max(0.0, self._deadline - self._clock())
        return (left, True) if left < own_limit else (own_limit, False)


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


def timed_out(c: RouteCandidate, limit: float, by_budget: bool) -> UpstreamTimeoutError:
    """The error of an attempt that had no first byte within ``limit`` (or the budget)."""
    why = "the request's failover budget ran out" if by_budget else f"no answer in {limit:g} s"
    return UpstreamTimeoutError(
        f"upstream timed out before its first byte: {why}",
        endpoint=c.endpoint,
        kind="budget" if by_budget else "ttft",
    )
