"""The failover loop: walk a RoutePlan's candidates, one observation per attempt.

Every chat-shaped surface goes through here, so selection, fallback and health accounting are
the same whatever API the client speaks. Rules:

- candidates are tried in plan order; a pinned plan has one candidate and never falls back;
- a stream falls back only before its first chunk; once a chunk is out it is committed;
- a committed stream that ends without any ``finish_reason`` is truncated: it fails;
- the error a client sees when all fail is deterministic: the first request-describing one
  (400/404/413/422) if any attempt got one, else the primary's;
- a client that goes away is not a failure: its attempt is observed as ``cancelled``;
- an attempt the upstream refused for its key (401, 402, 403, a spent quota) is retried at
  once on the same route's next spare key, before the next route: one key's problem is not
  the route's;
- a fallback on a capacity route is leased right before it is sent (refused: skipped); every
  attempt gives its lease back however it ends (a stream: when its relay ends);
- a plan with ``hedge_after_ms`` (RouteWise) races its second candidate against a primary
  without a first token by then (gateway/ingress/hedging.py); that backup is leased only if it
  runs. In that race a stream is open only once a chunk carries a token (a role-only first
  chunk does not): what came before is held and relayed with it, from the same upstream;
- an attempt's TTFT is when its first token arrived (hedged or not), not its first chunk.

``Failures`` keeps a request's errors, picks the one the client sees and says which routes a
refusal rules out (the rules it applies, needed only once an attempt failed, are
``failover.py``'s); ``Budget`` holds the hop cap and the wall-clock budget.

The loop is one (``Dispatcher._walk``) over the ``failover.AttemptKind`` seam: a whole answer
(``ONCE``, here: one call of the adapter under the attempt's first-byte limit, observed, its
lease given back however it ends; a success outside a hedge race once ``Dispatcher.call`` has
written it) and a stream (``stream_attempt.STREAM``) differ only in the
attempt itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import anyio
import msgspec

from gateway.http.deadline import Resumed
from gateway.http.errors import REQUEST_DESCRIBING, is_context_refusal
from gateway.ingress import hedging
from gateway.ingress.failover import (
    billed_by_failure,
    is_key_refusal,
    leased_fallback,
    merged_refusal,
    outcome_of,
    refused,
    soonest_back,
    timed_out,
    tokens_used_by_failure,
    unexpected,
)
from gateway.ingress.hedging import Declined
from gateway.ingress.request_info import Attempt, Served
from gateway.ingress.settling import LeaseKeeper, Settler, shielded, tokens
from gateway.ingress.stream_attempt import STREAM
from schemas import QUOTA_EXHAUSTED, ContentFilteredError, KeyPoolExhaustedError, UpstreamError
from schemas.canonical_markers import RATE_REPORT
from schemas.config import FailoverConfig
from schemas.routing import RateReport

if TYPE_CHECKING:
    from collections.abc import (
        AsyncGenerator,
        Awaitable,
        Callable,
        Coroutine,
        Mapping,
    )

    from bus import Bus
    from gateway.adapters.base import JSON, Adapter, UpstreamTarget
    from gateway.ingress.failover import AttemptKind
    from gateway.ingress.plan_walk import PlanWalk, Targets
    from gateway.ingress.request_info import RequestInfo
    from gateway.ingress.stream_attempt import StreamAttempt
    from schemas import RouteCandidate, RoutePlan

    Operation: TypeAlias = Callable[[Adapter, UpstreamTarget, str], Awaitable[JSON]]
    """One whole answer from ``adapter`` at ``target`` for the attempt's model (its plan's)."""

logger = logging.getLogger(__name__)

R = TypeVar("R")
P = TypeVar("P")


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
        return soonest_back(self.errors) if self.rate_limited() else self.errors[0]


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


class Dispatcher:
    """Runs attempts against adapters and publishes their observations. Raises GatewayError.

    ``clock`` (seconds, monotonic; ``RequestInfo.started`` must come from the same clock)
    measures the budget, attempt latencies and time to first token, so tests drive the
    budget without waiting; ``wall`` stamps observations. The per-attempt timeouts
    themselves run on the event loop.
    """

    def __init__(
        self,
        bus: Bus,
        adapters: Mapping[str, Adapter],
        targets: Targets,
        failover: FailoverConfig | None = None,
        leases: LeaseKeeper | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._bus = bus
        self._adapters = adapters
        self.targets = targets
        self._failover = failover or FailoverConfig()
        self.leases = leases or LeaseKeeper(bus, 30.0, "ingress")
        self._clock = clock
        self.now = clock
        """The dispatcher's clock (the callable itself: an attempt reads it directly)."""
        self.settle = Settler(bus, self.leases, targets, clock, wall)
        """Publishes the attempts' observations, gives back what unattempted ones hold."""
        self.observe = self.settle.observe
        self.publish = self.settle.publish
        self.release_plan = self.settle.release_plan

    def budget(self, info: RequestInfo) -> Budget:
        """A new budget for ``info``: its hop cap, deadline and wait for cooling routes."""
        return Budget(self._failover, info.started, self._clock)

    async def _attempts(
        self,
        info: RequestInfo,
        plan: RoutePlan,
        failures: Failures,
        budget: Budget,
        walk: PlanWalk | None,
    ) -> AsyncGenerator[Attempt]:
        """The attempts to make, within the hop cap and budget, skipping routes a
        context-length refusal ruled out; a route whose key the upstream refused is tried
        again at once on its next spare key (``Failures.next_key``). After the plan's
        candidates, the walk's next model's plan (a pinned plan never falls back; no plan is
        fetched once the budget is spent). A candidate handed out but never attempted has its
        leases released here."""
        attempt = 0
        current: RoutePlan | None = plan
        while current is not None:
            candidates = current.candidates
            self.leases.hold_plan(current)
            for i, planned in enumerate(candidates):
                if failures.errors and failures.rules_out(planned):  # none before a failure
                    await self.settle.give_back(info, current.model, planned)
                    continue
                hedge_backup = (
                    current is plan and i == 1 and attempt == 1 and plan.hedge_after_ms is not None
                )
                c: RouteCandidate | None = planned
                retry = False
                while c is not None:  # the route, then its spare keys while they are refused
                    if c.pool and not c.lease_id and not c.refusal and not hedge_backup:
                        # A fallback on a capacity route (or a retry on another key): leased
                        # right before it is sent (a hedge backup: if it fires, ``leased_late``).
                        leased = await leased_fallback(self, info, current, i + retry, c)
                        if leased is None:
                            break
                        c = leased
                    attempt += 1
                    if not budget.may_start(attempt):
                        await self.leases.release(c, unsent=True)
                        await self.settle.give_back_from(info, current, i + retry)
                        return
                    more = i + 1 < len(candidates) or (walk is not None and walk.has_more)
                    more = more and attempt < self._failover.max_attempts
                    yield Attempt(attempt, c, more, i == 0 and not retry, current.model)
                    c, hedge_backup, retry = failures.next_key(c), False, True
            if walk is None or current.pinned or not budget.may_start(attempt + 1):
                return
            # Shielded: the next model's primary arrives leased; a client gone meanwhile must
            # not lose that plan (its lease would stay taken until the TTL), so it is held and
            # the cancellation lands on its attempt, which releases it.
            with anyio.CancelScope(shield=True):
                current = await walk.next()
            if current is None and failures.rate_limited():
                # Every route tried asked us to slow down: the first one back, if it is near.
                current = await walk.after_cooling()

    async def call(
        self,
        info: RequestInfo,
        plan: RoutePlan,
        op: Operation,
        walk: PlanWalk | None = None,
        then: Callable[[Served], Coroutine[Any, Any, None]] | None = None,
    ) -> Served:
        """Try each candidate with ``op`` until one answers (then the walk's next models'),
        handing it the model each attempt serves; then ``then`` (the answer's write) before
        the serving attempt is settled, so the client does not wait on its bookkeeping. It is
        settled however ``then`` ends, and as soon as the write waits on the client (a full
        socket, HTTP/2 flow control): what the attempt holds never waits on a slow reader.
        Raises the deterministic error, and what ``then`` raises."""
        served = await self._walk(info, plan, walk, ONCE, op)
        settle, served.settle = served.settle, None
        if settle is None:  # settled in its hedge race
            if then is not None:
                await then(served)
            return served
        if then is None:
            await settle()
            return served
        write = then(served)
        try:
            waiting = write.send(None)
        except StopIteration:  # written at once, as an answer that fits the socket is
            await settle()
            return served
        except BaseException:  # a write broken: the attempt still settles
            await shielded(settle())
            raise
        try:
            await shielded(settle())
        except BaseException:  # cancelled meanwhile: the write is given up with the request
            write.close()
            raise
        await Resumed(write, waiting)
        return served

    async def open_stream(
        self, info: RequestInfo, plan: RoutePlan, body: JSON, walk: PlanWalk | None = None
    ) -> StreamAttempt:
        """Start a stream on the first candidate that yields a first chunk (then the walk's
        next models'). Raises the deterministic error when none does."""
        return await self._walk(info, plan, walk, STREAM, body)

    async def _walk(
        self,
        info: RequestInfo,
        plan: RoutePlan,
        walk: PlanWalk | None,
        kind: AttemptKind[R, P],
        payload: P,
    ) -> R:
        """The failover loop: each attempt of ``kind`` in turn (a hedged primary raced against
        its backup) until one succeeds. Raises the deterministic error."""
        failures = Failures()
        budget = (walk.budget if walk is not None else None) or self.budget(info)
        if walk is not None:
            walk.budget = budget  # one allowance for the walk's cooling waits and the loop's
        hedge_after_ms = plan.hedge_after_ms
        async with aclosing(self._attempts(info, plan, failures, budget, walk)) as attempts:
            async for planned in attempts:
                if planned.candidate.refusal:
                    await refused(self, info, planned, failures)
                    continue
                a = await self.leased_late(info, planned)
                if a is None:
                    continue
                backup = (
                    await hedging.backup_for(a, attempts) if hedge_after_ms is not None else None
                )
                if backup is None:
                    result = await kind.attempt(self, info, payload, a, budget, Declined(), False)
                    if not isinstance(result, UpstreamError):
                        return result
                    failures.add(result, a.candidate)
                    continue
                pair = (a, backup)
                if info.record.trace is not None:
                    info.record.trace.hedged(a.number, backup.number)
                raced = await hedging.race(
                    functools.partial(kind.attempt, self, info, payload, a, budget, hold=True),
                    functools.partial(
                        hedging.backup_side, self, kind, info, payload, backup, budget
                    ),
                    hedge_after_ms or 0.0,
                    discard=kind.discard,
                )
                if raced.winner is not None:
                    won = raced.results[raced.winner]
                    assert won is not None and not isinstance(won, UpstreamError)
                    return won
                hedging.raced_failures(pair, raced.results, failures)
        raise failures.final()

    async def leased_late(self, info: RequestInfo, a: Attempt) -> Attempt | None:
        """``a`` with its capacity lease. Only a plan's hedge backup arrives unleased from
        ``_attempts``; leased here like any fallback, right before it is sent. None when
        its pool refuses (the route is skipped)."""
        c = a.candidate
        if not c.pool or c.lease_id or c.refusal:
            return a
        leased = await self.leases.acquire(c, info.request_id, info.prompt_estimate)
        if leased is None:  # never sent: the ModelActor must not count it in flight
            await self.settle.give_back(info, a.model, c)
            return None
        return a._replace(candidate=leased)

    def adapter(self, c: RouteCandidate) -> Adapter:
        """The adapter of ``c``'s kind. Raises UpstreamError when none serves it."""
        adapter = self._adapters.get(c.kind)
        if adapter is None:
            raise UpstreamError(
                f"no adapter for upstream kind {c.kind!r}", endpoint=c.endpoint, kind="no_adapter"
            )
        return adapter


# ---------------------------------------------------------------------------- a whole answer


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
        lease is given back however it ends (with the reported tokens when known): a failure
        here, a success outside a hedge race by its ``Served.settle``."""
        attempt, c, more = a.number, a.candidate, a.more
        settled = False
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
                    rate = body.pop(RATE_REPORT, None)
                    if type(rate) is not RateReport:  # an upstream's own key of that name
                        rate = None
            except UpstreamError as err:
                billed = billed_by_failure(err)
                used = tokens(billed) if billed.reported else tokens_used_by_failure(err)
                await d.leases.release(c, used)
                await d.observe(info, a, outcome_of(err), started, err=err, usage=billed)
                return err
            except TimeoutError:
                timeout = timed_out(c, limit, by_budget, stream=False)
                outcome = "cancelled" if by_budget else "failure"
                await d.observe(info, a, outcome, started, err=timeout)
                return timeout
            except (anyio.get_cancelled_exc_class(), RecursionError):
                # RecursionError: a body nested just short of the decode limit cannot be encoded
                # again for the upstream (the app answers 400), but the attempt must still end
                # here, or its prefill and probe leases are never given back.
                await d.observe(info, a, "cancelled", started, err=declined.error(c.endpoint))
                raise
            except Exception as exc:  # not the route's fault, but the attempt ends
                how, why = unexpected(c.endpoint, exc)
                await d.observe(info, a, how, started, err=why)
                raise
            if hold:  # a side of a hedge race, which may drop it: settled now
                await d.settle.answered(info, a, started, body, rate=rate)
                settled = True
                return Served(body, c, attempt, a.model)
            # Noted now (not with the settling), so the overhead header the write carries counts it.
            info.record.in_flight.append((started, ended := d.now()))
            settled = True  # by ``Served.settle``, which ``Dispatcher.call`` runs
            settle = functools.partial(d.settle.answered, info, a, started, body, ended, rate=rate)
            return Served(body, c, attempt, a.model, settle)
        finally:
            if not settled:  # else released with the tokens the answer reported
                await d.leases.release(c)  # a no-op once released above

    async def discard(self, result: Served) -> None:
        """A whole answer that lost a hedge race was settled as it came (``hold``)."""


ONCE = _Once()
"""The whole-answer ``AttemptKind``."""
