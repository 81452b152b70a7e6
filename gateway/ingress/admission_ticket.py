"""One limited request's admission at the ingress: a :class:`Ticket` holds its verdict (the
rate headers it answers with, or the refusal it raises), counts what its attempts used, and
settles its lease when it ends, however it ends. ``gateway.ingress.admission`` issues tickets
and sends their admissions and settles to the limits' owner.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import anyio

from gateway.http.errors import DEFAULT_RETRY_AFTER_S
from schemas import (
    BudgetExceededError,
    BusTimeoutError,
    GatewayError,
    LimitsUnavailableError,
    RateLimitedError,
)
from schemas.limits import LimitSettle

if TYPE_CHECKING:
    from gateway.http.request import HttpRequest
    from gateway.ingress.admission import Admission
    from schemas import Observation
    from schemas.limits import AdmitReply, AdmitRequest

logger = logging.getLogger(__name__)


def _seconds(value: float | None) -> bytes:
    return f"{max(0, math.ceil(value or 0))}s".encode()


def rate_headers(reply: AdmitReply) -> list[tuple[bytes, bytes]]:
    """The ``x-ratelimit-*`` headers of a verdict (the axes the caller is limited on)."""
    out = []
    if reply.limit_requests is not None:
        out += [
            (b"x-ratelimit-limit-requests", str(reply.limit_requests).encode()),
            (b"x-ratelimit-remaining-requests", str(reply.remaining_requests).encode()),
            (b"x-ratelimit-reset-requests", _seconds(reply.reset_requests)),
        ]
    if reply.limit_tokens is not None:
        out += [
            (b"x-ratelimit-limit-tokens", str(reply.limit_tokens).encode()),
            (b"x-ratelimit-remaining-tokens", str(reply.remaining_tokens).encode()),
            (b"x-ratelimit-reset-tokens", _seconds(reply.reset_tokens)),
        ]
    return out


class Ticket:
    """One limited request's lease: its verdict, what its attempts used, its settlement."""

    __slots__ = (
        "_admission",
        "_cost",
        "_decided",
        "_held",
        "_maybe_held",
        "_open",
        "_req",
        "_request",
        "_tokens",
        "_verdict",
    )

    def __init__(self, admission: Admission, req: HttpRequest, request: AdmitRequest) -> None:
        self._admission = admission
        self._req = req
        self._request = request
        self._verdict = admission.ask(request)
        self._decided = False
        self._held = False  # the owner holds a lease for this request
        self._open = False  # admitted without the owner's answer (fail open)
        # Refused for want of a verdict in time: the owner may still have taken a lease.
        self._maybe_held = False
        self._tokens = 0
        self._cost = 0.0

    async def decide(self) -> None:
        """Wait for the verdict. Raises RateLimitedError or BudgetExceededError (refused),
        LimitsUnavailableError (no answer in time, failing closed)."""
        if self._decided:
            return
        self._decided = True
        try:
            reply = await self._verdict
        except GatewayError as exc:
            if self._admission.settings.fail_open:
                logger.warning(
                    "limits: owner unreachable (%s); admitting %s (fail open)",
                    exc.message,
                    self._request.request_id,
                )
                self._open = True
                return
            # A verdict late, not lost: the owner (slow to save, or just taking over) may
            # have taken the lease, which nobody would give back before its TTL ran out.
            self._maybe_held = isinstance(exc, BusTimeoutError)
            raise LimitsUnavailableError(
                "the gateway could not check this key's limits in time; retry shortly",
                retry_after=DEFAULT_RETRY_AFTER_S,
            ) from None
        self._req.extra_headers = rate_headers(reply)
        if reply.admitted:
            self._held = True
            self._admission.running[self._request.request_id] = self
            return
        if reply.code == "budget_exceeded":
            raise BudgetExceededError(
                reply.message,
                retry_after=reply.retry_after,
                status=self._admission.settings.budget_status,
            )
        raise RateLimitedError(reply.message, retry_after=reply.retry_after)

    def attempted(self, obs: Observation) -> None:
        """Count one attempt's usage toward the settlement."""
        self._tokens += obs.billed_tokens
        self._cost += obs.cost_usd

    async def finish(self) -> None:
        """Settle the lease (or count the fail-open request); never raises."""
        if not self._decided:  # the request failed before its verdict was needed
            with anyio.CancelScope(shield=True):
                try:
                    await self.decide()
                except GatewayError:
                    pass
                except Exception:  # a settle must never fail the request's answer
                    logger.exception("limits: verdict of %s unreadable", self._request.request_id)
        # From here on nothing awaits: a cancellation cannot cut the settle short.
        self._admission.running.pop(self._request.request_id, None)
        if not (self._held or self._open or self._maybe_held):
            return
        r = self._request
        done = LimitSettle(  # of a lease maybe held: nothing used (the owner's no-op if none)
            request_id=r.request_id,
            subjects=r.subjects,
            role=r.role,
            tokens=self._tokens,
            cost_usd=self._cost,
            unadmitted=self._open,
        )
        if self._open:
            self._admission.owe(done)
        else:
            self._admission.settle(done)
