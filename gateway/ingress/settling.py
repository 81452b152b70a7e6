"""Settling an attempt: what it used (the tokens an upstream reported, or the estimate when it
reported none, their price, the ``Observation`` that carries them) and its capacity lease.

:class:`LeaseKeeper` holds the leases of the requests in flight: a plan's primary arrives
leased (its ModelActor asked the pool's owner), a fallback on a capacity route is leased here
before it is dispatched (refused: skipped). One task per ingress renews every held lease with
one ``CapacityRenew`` per pool every ``ttl / 3``; the attempt's end, however it ends, releases
it (twice is harmless). A lease this ingress stops renewing (it died) expires at its owner
after the TTL; one held past ``max_age`` (a path that forgot it) is dropped with a warning.

:class:`Settler` publishes each attempt's ``Observation`` (shielded: a client gone must not
cancel it, :func:`shielded`) and gives back what a candidate never attempted holds.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

import anyio
import msgspec

from bus import Bus, NoRespondersError, RequestTimeoutError
from gateway.formats.openai_chat import content_chars
from gateway.http.component import Component
from gateway.http.deadline import Resumed
from gateway.ingress.observation_batch import observation_batcher
from schemas import (
    CapacityAcquire,
    CapacityGrant,
    CapacityRelease,
    CapacityRenew,
    FirstToken,
    GatewayError,
    Message,
    Observation,
    RouteCandidate,
    RoutePlan,
    UpstreamError,
    subjects,
)
from schemas.pricing import cost_usd

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from gateway.adapters.base import JSON
    from gateway.ingress.plan_walk import Targets
    from gateway.ingress.request_info import Attempt, RequestInfo
    from schemas.config import GatewayConfig
    from schemas.pricing import Pricing
    from schemas.routing import RateReport

logger = logging.getLogger(__name__)

T = TypeVar("T")
_SUBJECTS_MAX = 4096

_ACQUIRE_TIMEOUT = 2.0


class Usage(NamedTuple):
    """Tokens an upstream reported (``reported`` False: no final usage; a stream's start's)."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0
    cache_written: int = 0
    reported: bool = False
    cache_written_1h: int = 0  # of cache_written, the writes with a 1-hour TTL (Claude's)


NO_USAGE = Usage()
CHARS_PER_TOKEN = 4  # the estimate's ratio, as the prompt estimate's


def usage_of(body: JSON) -> Usage:
    """The tokens of an OpenAI-shaped ``usage`` (Anthropic's cache writes arrive in
    ``prompt_tokens_details.cache_write_tokens``, see adapters/_anthropic_to_canonical.py).
    A ``usage`` whose counts are not numbers (``"n/a"``, a list, infinity) is none reported:
    an upstream's odd bookkeeping never fails the answer it came with."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return NO_USAGE
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict):
        details = {}
    try:
        return Usage(
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
            int(details.get("cached_tokens") or 0),
            int(details.get("cache_write_tokens") or 0),
            True,
            int(details.get("cache_write_1h_tokens") or 0),
        )
    except (TypeError, ValueError, OverflowError):
        return NO_USAGE


def tokens(usage: Usage) -> int | None:
    """Prompt plus completion tokens an upstream reported; None when it reported none."""
    return usage.prompt + usage.completion or None


def observation(
    info: RequestInfo,
    model: str,
    c: RouteCandidate,
    attempt: int,
    outcome: str,
    started: float,
    now: float,
    ts: float,
    pricing: Pricing | None,
    *,
    err: UpstreamError | None = None,
    ttft: float | None = None,
    usage: Usage = NO_USAGE,
    sent_chars: int = 0,
    committed: bool = False,
    rate: RateReport | None = None,
) -> Observation:
    """The Observation of one attempt at ``model`` that ended at ``now`` (``ts``: wall clock),
    priced by ``pricing``; an answer without reported usage is billed on the estimate."""
    prompt, completion, cancelled = usage.prompt, usage.completion, outcome == "cancelled"
    estimated = not usage.reported and (outcome == "success" or sent_chars > 0 or prompt > 0)
    if estimated:
        prompt = prompt or info.prompt_estimate
        completion = max(completion, -(-sent_chars // CHARS_PER_TOKEN))
    cost = (
        0.0  # an unpriced route costs nothing, as ``cost_usd`` says: no need to ask it
        if pricing is None
        else cost_usd(
            pricing,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cache_read_tokens=usage.cached,
            cache_write_tokens=usage.cache_written,
            cache_write_1h_tokens=usage.cache_written_1h,
        )
    )
    return Observation(
        endpoint=c.endpoint,
        model=model,
        outcome=outcome,
        attempt=attempt,
        # A cancelled attempt had no answer but a stream's that was relayed (an attempt row
        # said 200 for one cancelled before any header).
        status=err.status if err is not None else None if cancelled and not committed else 200,
        error_kind=err.kind if err is not None else "",
        auth_rejection=bool(err is not None and err.is_auth_rejection),
        probe=c.probe,
        stream=info.stream,
        fallback=attempt > 1,
        ttft_ms=(ttft - started) * 1000 if ttft is not None else None,
        latency_ms=(now - started) * 1000,
        prompt_tokens=usage.prompt,
        completion_tokens=usage.completion,
        cached_tokens=usage.cached,
        cache_write_tokens=usage.cache_written,
        cost_usd=cost,
        cost_estimated=estimated,
        billed_tokens=prompt + completion,
        retry_after=err.retry_after if err is not None else None,
        caller=info.caller,
        request_id=info.request_id,
        surface=info.surface,
        credential_id=c.credential_id,
        ts=ts,
        prompt_estimate=info.prompt_estimate,
        role=info.role,
        trace_id=info.record.trace.trace_id if info.record.trace is not None else "",
        committed=committed,
        rate=rate,
    )


class LeaseKeeper(Component):
    """Holds, renews and releases one ingress's capacity leases (never raises: a lease that
    cannot be renewed or released expires at its owner)."""

    def __init__(
        self,
        bus: Bus,
        ttl: float,
        holder: str,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        *,
        max_age: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._bus = bus
        self._interval = ttl / 3
        self._max_age = max_age
        self.holder = holder
        self._sleep = sleep
        self._clock = clock
        self._held: dict[str, tuple[str, float]] = {}  # lease id -> (pool, held since)
        self.acquire_timeout = _ACQUIRE_TIMEOUT
        self._task: asyncio.Task[None] | None = None
        self._late: set[asyncio.Future[None]] = set()  # releases of grants nobody awaits

    def reconfigure(self, config: GatewayConfig) -> None:
        """Follow ``config``'s lease TTL and maximum age (see :meth:`retune`)."""
        self.retune(config.routing.leases.ttl_seconds, config.lease_max_age())

    def retune(self, ttl: float, max_age: float | None = None) -> None:
        """Renew every ``ttl / 3`` from the next renewal on (held leases keep the expiry of their
        last renewal), and drop leases held longer than ``max_age``."""
        self._interval = ttl / 3
        self._max_age = max_age

    @property
    def interval(self) -> float:
        """Seconds between two renewals."""
        return self._interval

    def held(self) -> int:
        """How many leases are held now."""
        return len(self._held)

    def hold_plan(self, plan: RoutePlan) -> None:
        """Keep renewing the leases a plan arrived with (its primary's)."""
        for c in plan.candidates:
            if c.lease_id:
                self._hold(c)

    def _hold(self, c: RouteCandidate) -> None:
        self._held[c.lease_id] = (c.pool, self._clock())
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._renew_forever(), name="capacity-renewals")

    async def acquire(
        self, c: RouteCandidate, request_id: str, tokens: int = 0
    ) -> RouteCandidate | None:
        """Lease ``c``'s unit or slot before dispatching to it (``tokens``: the prompt estimate a
        token quota reserves): the leased candidate, or None when the pool refuses or is mute."""
        ask = CapacityAcquire(
            pool=c.pool,
            endpoint=c.endpoint,
            request_id=request_id,
            holder=self.holder,
            units=float(max(1, tokens)),
            lease_id=secrets.token_hex(8),
        )
        subject, timeout = subjects.capacity_acquire(c.pool), self.acquire_timeout
        asking = asyncio.ensure_future(
            self._bus.request(subject, ask, reply_type=CapacityGrant, timeout=timeout)
        )
        try:
            # Shielded: a grant that arrives after the client went away is still held (and
            # so released by the attempt the cancellation then ends), never lost at its
            # owner until the TTL (a quota unit lost so would stay charged). A plain
            # ``task.cancel()`` (a hedge race stopping its loser) goes through an anyio
            # shield, not ``asyncio.shield``: the grant is then released as it comes.
            with anyio.CancelScope(shield=True):
                grant = await asyncio.shield(asking)
        except asyncio.CancelledError:
            self._late.add(late := asyncio.ensure_future(self._release_late(asking, ask)))
            late.add_done_callback(self._late.discard)
            raise
        except RequestTimeoutError:
            # The owner may have granted it and its answer be late (a NATS reconnect): give
            # the proposed lease back, or it would hold a slot for a TTL serving no one.
            logger.warning(
                "capacity pool %s did not answer a lease for %s in time", c.pool, c.endpoint
            )
            await self._publish_release(c.pool, ask.lease_id, 0.0, unsent=True)
            return None
        except NoRespondersError:
            logger.warning("capacity pool %s has no owner to lease %s from", c.pool, c.endpoint)
            return None
        if not isinstance(grant, CapacityGrant) or not grant.granted:
            return None
        leased = msgspec.structs.replace(c, lease_id=grant.lease_id)
        self._hold(leased)
        return leased

    async def _release_late(self, asking: asyncio.Future[Any], ask: CapacityAcquire) -> None:
        await asyncio.wait([asking])  # a release of a lease never granted is ignored
        await self._publish_release(ask.pool, ask.lease_id, 0.0, unsent=True)

    async def release(
        self, c: RouteCandidate, tokens: int | None = None, *, unsent: bool = False
    ) -> None:
        """Give ``c``'s held lease back, with the tokens the upstream reported (None: unknown);
        ``unsent``: the request never reached it (a quota charges it nothing)."""
        held = self._held.pop(c.lease_id, None) if c.lease_id else None
        if held is None:
            return
        used = None if tokens is None else float(tokens)
        await self._publish_release(held[0], c.lease_id, used, unsent=unsent)

    async def _publish_release(
        self, pool: str, lease_id: str, used: float | None, *, unsent: bool = False
    ) -> None:
        msg = CapacityRelease(pool=pool, lease_id=lease_id, used_units=used, unsent=unsent)
        try:
            with anyio.CancelScope(shield=True):  # a cancelled request still gives it back
                await self._bus.publish(subjects.capacity_release(pool), msg)
        except GatewayError as exc:
            logger.warning("capacity release on %s not published: %s", pool, exc)

    async def _renew_forever(self) -> None:
        while self._held:
            await self._sleep(self._interval)
            self._drop_aged()
            by_pool: dict[str, list[str]] = defaultdict(list)
            for lease_id, (pool, _) in self._held.items():
                by_pool[pool].append(lease_id)
            for pool, ids in by_pool.items():
                try:
                    await self._bus.publish(
                        subjects.capacity_renew(pool),
                        CapacityRenew(pool=pool, holder=self.holder, lease_ids=tuple(ids)),
                    )
                except GatewayError as exc:
                    logger.warning("capacity renewal on %s not published: %s", pool, exc)

    def _drop_aged(self) -> None:
        """Forget leases held past the maximum age: their owner expired them already."""
        if self._max_age is None:
            return
        now = self._clock()
        for lease_id, (pool, since) in list(self._held.items()):
            if now - since >= self._max_age:
                del self._held[lease_id]
                logger.warning(
                    "capacity lease on pool %s held for %gs, past its maximum age, "
                    "without a release: no longer renewed",
                    pool,
                    now - since,
                )

    async def aclose(self) -> None:
        """Stop renewing (held leases then expire at their owners)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


# ---------------------------------------------------------------------------- settling


class Settler:
    """Settles the attempts of one dispatcher's requests: publishes each attempt's priced
    ``Observation`` (noted on its request's record first) and gives back what a candidate never
    attempted holds. Never raises. ``clock`` (monotonic seconds: the dispatcher's) times
    attempts; ``wall`` stamps observations; ``targets`` knows each endpoint's price."""

    def __init__(
        self,
        bus: Bus,
        leases: LeaseKeeper,
        targets: Targets,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self._bus = bus
        self.leases = leases
        self.targets = targets
        self._clock = clock
        self._wall = wall
        self._subjects: dict[str, str] = {}  # endpoint -> its observations' subject
        self._batcher = observation_batcher(bus)
        self._send_observation = self.publish if self._batcher is None else self._batcher.publish

    def _observed_on(self, endpoint: str) -> str:
        """The subject of ``endpoint``'s observations, built once per endpoint."""
        subject = self._subjects.get(endpoint)
        if subject is None:
            if len(self._subjects) >= _SUBJECTS_MAX:
                self._subjects.clear()
            subject = self._subjects[endpoint] = subjects.observation(endpoint)
        return subject

    async def give_back_from(self, info: RequestInfo, plan: RoutePlan, start: int) -> None:
        """Release the leases of ``plan``'s candidates from ``start`` on (never attempted)."""
        for i in range(start, len(plan.candidates)):
            await self.give_back(info, plan.model, plan.candidates[i])

    async def release_plan(self, info: RequestInfo, plan: RoutePlan) -> None:
        """Give back the leases of a plan none of whose candidates will be attempted (its
        caller's limits refused it), its primary's too (held first: only held ones go back)."""
        self.leases.hold_plan(plan)
        await self.give_back_from(info, plan, 0)

    async def give_back(self, info: RequestInfo, model: str, c: RouteCandidate) -> None:
        """Give back what a candidate that is never attempted holds: the probe lease (a
        cancelled probe observation, which releases the prefill lease too) or the model's
        prefill lease and the ModelActor's in-flight count (``FirstToken.unsent``); and its
        capacity lease. Not an attempt: the request's accounting does not count it."""
        await self.leases.release(c, unsent=True)  # a quota's charge of it comes back
        if self._batcher is not None:
            # The failure observed last moves the ModelActor's count to ``c``: it goes first.
            self._batcher.flush()
        if c.probe:
            now = self._clock()
            pricing = self.targets.prices.get(c.endpoint)
            obs = observation(info, model, c, 0, "cancelled", now, now, self._wall(), pricing)
            await self.publish(self._observed_on(c.endpoint), obs)
        elif not c.refusal:
            # Also ends the in-flight count the ModelActor may hold for it (after a failure
            # it counts the next candidate as sent).
            unsent = FirstToken(endpoint=c.endpoint, request_id=info.request_id, unsent=True)
            await self.publish(subjects.model_first_token(model), unsent)

    async def answered(
        self,
        info: RequestInfo,
        a: Attempt,
        started: float,
        body: JSON,
        ended: float | None = None,
        rate: RateReport | None = None,
    ) -> None:
        """Settle attempt ``a``, which answered ``body`` whole (at ``ended``, default now, on
        ``started``'s clock): its success observed with the usage the upstream reported (or
        the estimate) and the request limit it reported, then its lease given back."""
        usage = NO_USAGE
        try:
            usage = usage_of(body)
            sent = 0 if usage.reported else content_chars(body)
            await self.observe(
                info, a, "success", started, usage=usage, sent_chars=sent, ended=ended, rate=rate
            )
        finally:  # the lease goes back whatever the bookkeeping met
            await self.leases.release(a.candidate, tokens(usage))

    async def observe(
        self,
        info: RequestInfo,
        a: Attempt,
        outcome: str,
        started: float,
        *,
        err: UpstreamError | None = None,
        ttft: float | None = None,
        usage: Usage = NO_USAGE,
        sent_chars: int = 0,
        ended: float | None = None,
        committed: bool = False,
        rate: RateReport | None = None,
    ) -> None:
        """Publish the Observation of attempt ``a``, which ended at ``ended`` (default now, on
        ``started``'s clock; never raises: accounting must not fail a request)."""
        c = a.candidate
        now, wall = self._clock(), self._wall()
        if ended is not None:  # settled after the fact: stamped when it ended
            now, wall = ended, wall - (now - ended)
        obs = observation(
            info,
            a.model,
            c,
            a.number,
            outcome,
            started,
            now,
            wall,
            self.targets.prices.get(c.endpoint),
            err=err,
            ttft=ttft,
            usage=usage,
            sent_chars=sent_chars,
            committed=committed,
            rate=rate,
        )
        record = info.record
        record.attempted(obs, started)
        if record.trace is not None:
            record.trace.attempt_done(obs, None if ended is None else int(wall * 1e9))
        if info.on_attempt is not None:
            info.on_attempt(obs)
        await self._send_observation(self._observed_on(c.endpoint), obs)

    async def publish(self, subject: str, msg: Message) -> None:
        """Fire-and-forget; accounting must never fail (or be cancelled out of) a request."""
        try:
            await shielded(self._bus.publish(subject, msg))
        except GatewayError as exc:
            logger.warning("event on %s not published: %s", subject, exc)


async def shielded(coro: Coroutine[Any, Any, T]) -> T:
    """``coro``'s result, ``coro`` shielded from cancellation from its first suspension on
    (before it, none can land). Raises what ``coro`` raises. An anyio shield costs about
    5 µs to enter and leave, and an in-process publish never suspends: it needs none."""
    try:
        first = coro.send(None)
    except StopIteration as done:
        return cast("T", done.value)
    with anyio.CancelScope(shield=True):
        result = await Resumed(coro, first)
    return result
