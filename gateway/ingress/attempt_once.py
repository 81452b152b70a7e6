"""A whole-answer attempt (chat completions without a stream, embeddings): one call of the
adapter under the attempt's first-byte limit, observed, its lease given back however it ends.
The failover loop runs it as its ``AttemptKind`` ``ONCE``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, TypeAlias

import anyio

from gateway.ingress.failover import outcome_of, timed_out
from gateway.ingress.leases import tokens_used_by_failure
from gateway.ingress.request_info import Served
from gateway.ingress.usage import content_chars, tokens, usage_of
from schemas import UpstreamError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gateway.adapters.base import JSON, Adapter, UpstreamTarget
    from gateway.ingress.dispatch import Dispatcher
    from gateway.ingress.failover import Budget
    from gateway.ingress.hedging import Declined
    from gateway.ingress.request_info import Attempt, RequestInfo

    Operation: TypeAlias = Callable[[Adapter, UpstreamTarget, str], Awaitable[JSON]]
    """One whole answer from ``adapter`` at ``target`` for the attempt's model (its plan's)."""


class _Once:
    """Whole answers; stateless, one instance (``ONCE``)."""

    __slots__ = ()

    async def attempt(
        self,
        d: Dispatcher,
        info: RequestInfo,
        payload: Operation,
        a: Attempt,
        budget: Budget,
        declined: Declined,
        hold: bool,
    ) -> Served | UpstreamError:
        """One observed attempt: the answer, or the error it failed with. Its capacity
        lease is given back however it ends (with the reported tokens when known)."""
        attempt, c, more = a.number, a.candidate, a.more
        used: int | None = None
        trace = info.record.trace
        try:
            started = d.now()
            target = d.targets.resolve(c)
            if trace is not None:
                target = trace.attempt(attempt, c, target, info.surface, info.stream)
            limit, by_budget = budget.first_byte_limit(attempt, target.timeout, more)
            try:
                async with asyncio.timeout(limit):
                    adapter = d.adapter(c)
                    if trace is not None:
                        adapter = trace.noting(adapter, attempt)
                    body = await payload(adapter, target, a.model)
            except UpstreamError as err:
                await d.leases.release(c, tokens_used_by_failure(err))
                await d.observe(info, a, outcome_of(err), started, err=err)
                return err
            except TimeoutError:
                timeout = timed_out(c, limit, by_budget)
                outcome = "cancelled" if by_budget else "failure"
                await d.observe(info, a, outcome, started, err=timeout)
                return timeout
            except (anyio.get_cancelled_exc_class(), RecursionError):
                # RecursionError: a body nested just short of the decode limit cannot be
                # encoded again for the upstream; the app refuses it (400), but the attempt
                # must still end here, or its prefill and probe leases are never given back.
                await d.observe(info, a, "cancelled", started, err=declined.error(c.endpoint))
                raise
            usage = usage_of(body)
            await d.observe(
                info,
                a,
                "success",
                started,
                usage=usage,
                sent_chars=0 if usage.reported else content_chars(body),
            )
            used = tokens(usage)
            return Served(body, c, attempt, a.model)
        finally:
            await d.leases.release(c, used)  # a no-op once released above

    async def discard(self, result: Served) -> None:
        """A whole answer that lost a hedge race holds nothing to release."""


ONCE = _Once()
"""The whole-answer ``AttemptKind``."""
