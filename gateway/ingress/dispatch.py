"""The failover loop: walk a RoutePlan's candidates, one observation per attempt.

Every chat-shaped surface goes through here, so selection, fallback and health accounting are
the same whatever API the client speaks. Rules:

- candidates are tried in plan order; a pinned plan has one candidate and never falls back;
- a stream falls back only before its first chunk; once a chunk is out it is committed;
- a committed stream that ends without any ``finish_reason`` is truncated: it fails;
- the error a client sees when all fail is deterministic: the first request-describing one
  (400/404/413/422) if any attempt got one, else the primary's;
- a client that goes away is not a failure: its attempt is observed as ``cancelled``;
- a fallback on a capacity route is leased right before it is sent (refused: skipped); every
  attempt gives its lease back however it ends (a stream: when its relay ends);
- a plan with ``hedge_after_ms`` (RouteWise) races its second candidate against a primary
  without a first token by then (gateway/ingress/hedging.py); that backup is leased only if it
  runs. In that race a stream is open only once a chunk carries a token (a role-only first
  chunk does not): what came before is held and relayed with it, from the same upstream;
- an attempt's TTFT is when its first token arrived (hedged or not), not its first chunk.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import anyio

from gateway.adapters.base import JSON, Adapter, Batch, UpstreamTarget, carries_token
from gateway.ingress import hedging
from gateway.ingress.accounting import RequestRecord
from gateway.ingress.errors import REQUEST_DESCRIBING
from gateway.ingress.hedging import Declined
from gateway.ingress.leases import LeaseKeeper, tokens_used_by_failure
from schemas import (
    ContentFilteredError,
    FirstToken,
    GatewayError,
    KeyPoolExhaustedError,
    KeyPoolRoleRestrictedError,
    Message,
    Observation,
    ProbeFirstByte,
    RouteCandidate,
    RoutePlan,
    UpstreamError,
    UpstreamTimeoutError,
    subjects,
)
from schemas.config import FailoverConfig, GatewayConfig, RouteConfig
from schemas.pricing import Pricing, cost_usd

if TYPE_CHECKING:
    from collections.abc import (
        AsyncGenerator,
        AsyncIterator,
        Awaitable,
        Callable,
        Mapping,
        Sequence,
    )

    from bus import Bus
    from gateway.ingress.targets import PlanWalk

logger = logging.getLogger(__name__)

_DEFAULT_ROUTE = RouteConfig(kind="echo")


class SecretSource(Protocol):
    """Where secrets of credentials the config does not hold come from (database keys:
    ``gateway.auth.provider_secrets.ProviderSecrets``, which the app passes in)."""

    def get(self, cid: str) -> str | None:
        """The secret of credential ``cid``; None when this source has none."""
        ...


class _NoSecrets:
    def get(self, cid: str) -> str | None:
        return None


NO_SECRETS: SecretSource = _NoSecrets()


class Targets:
    """Resolves a plan's candidate into an UpstreamTarget, secret included: from the config,
    else from ``runtime`` (the secrets of keys added at runtime)."""

    def __init__(self, config: GatewayConfig, runtime: SecretSource = NO_SECRETS) -> None:
        self._runtime = runtime
        self._routes: dict[str, RouteConfig] = {}
        self._secrets: dict[str, str] = {}
        for model in config.models:
            for eid, route in zip(model.endpoint_ids(), model.route, strict=True):
                self._routes[eid] = route
                for cid, secret in zip(route.credential_ids, route.secrets, strict=True):
                    self._secrets[cid] = secret

    def pricing(self, endpoint: str) -> Pricing | None:
        """The ``pricing:`` of ``endpoint``'s route (None: unpriced or unknown)."""
        route = self._routes.get(endpoint)
        return route.pricing if route is not None else None

    def resolve(self, c: RouteCandidate) -> UpstreamTarget:
        """The target for candidate ``c`` (unknown endpoints get default timeouts)."""
        route = self._routes.get(c.endpoint, _DEFAULT_ROUTE)
        return UpstreamTarget(
            endpoint=c.endpoint,
            kind=c.kind,
            base_url=c.base_url,
            upstream_model=c.upstream_model,
            api_key=(
                self._secrets.get(c.credential_id) or self._runtime.get(c.credential_id)
                if c.credential_id
                else None
            ),
            timeout=route.timeout_seconds,
            connect_timeout=route.connect_timeout_seconds,
            ttft_timeout=route.ttft_timeout_seconds,
            idle_timeout=route.idle_timeout_seconds,
            azure=route.azure,
            bedrock=route.bedrock,
        )


@dataclass(slots=True)
class RequestInfo:
    """Who asked for what; carried into every observation of the request, with the record
    the request's accounting fills (its attempts)."""

    request_id: str
    model: str
    surface: str
    stream: bool
    caller: str = ""
    prompt_estimate: int = 0
    started: float = field(default_factory=time.perf_counter)
    role: str | None = None
    record: RequestRecord = field(default_factory=RequestRecord)
    on_attempt: Callable[[Observation], None] | None = None
    """Called with each attempt's Observation (the request's limits lease settles from them)."""


class Attempt(NamedTuple):
    """One attempt to make: its number in the request, the candidate, whether another
    candidate follows, and whether it is the first of its model's plan (the one holding
    that model's prefill lease)."""

    number: int
    candidate: RouteCandidate
    more: bool
    first_of_plan: bool


@dataclass(slots=True)
class Served:
    """A successful non-streaming answer and the candidate that served it."""

    body: JSON
    candidate: RouteCandidate
    attempts: int


class Usage(NamedTuple):
    """Tokens an upstream reported (``reported`` False: it reported none)."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0
    cache_written: int = 0
    reported: bool = False


NO_USAGE = Usage()
_CHARS_PER_TOKEN = 4  # the estimate's ratio, as the prompt estimate's


def usage_of(body: JSON) -> Usage:
    """The tokens of an OpenAI-shaped ``usage`` (Anthropic's cache writes arrive in
    ``prompt_tokens_details.cache_write_tokens``, see adapters/_anthropic_to_canonical.py)."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return NO_USAGE
    details = usage.get("prompt_tokens_details")
    cached = written = 0
    if isinstance(details, dict):
        cached = details.get("cached_tokens") or 0
        written = details.get("cache_write_tokens") or 0
    return Usage(
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
        int(cached),
        int(written),
        True,
    )


def content_chars(body: JSON) -> int:
    """Characters of a chat answer's content and tool arguments (what the estimate prices
    when the upstream reports no usage)."""
    total = 0
    for choice in body.get("choices") or ():
        message = choice.get("message") or {} if isinstance(choice, dict) else {}
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        for call in message.get("tool_calls") or ():
            args = (call.get("function") or {}).get("arguments") if isinstance(call, dict) else None
            if isinstance(args, str):
                total += len(args)
    return total


def _outcome_of(err: UpstreamError) -> str:
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


class _Failures:
    """The errors of a request's attempts, which one the client is shown, and which
    remaining routes a context-length refusal rules out."""

    def __init__(self) -> None:
        self.errors: list[UpstreamError] = []
        self._refused_window: int | None = None
        self._filtered = False

    def add(self, err: UpstreamError, c: RouteCandidate) -> None:
        self.errors.append(err)
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

    def final(self) -> UpstreamError:
        if self.errors and all(isinstance(e, KeyPoolExhaustedError) for e in self.errors):
            return _merged_refusal(self.errors)
        for err in self.errors:
            if err.status in REQUEST_DESCRIBING:
                return err
        return self.errors[0]


class _Budget:
    """One request's hop cap and wall-clock budget (``routing.failover``), on ``clock``."""

    __slots__ = ("_clock", "_deadline", "_max")

    def __init__(
        self, settings: FailoverConfig, started: float, clock: Callable[[], float]
    ) -> None:
        self._clock = clock
        self._max = settings.max_attempts
        self._deadline = started + settings.budget_seconds if settings.budget_seconds else None

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
        self._targets = targets
        self._failover = failover or FailoverConfig()
        self.leases = leases or LeaseKeeper(bus, 30.0, "ingress")
        self._clock = clock
        self._wall = wall

    def now(self) -> float:
        """The dispatcher's clock."""
        return self._clock()

    async def _attempts(
        self,
        info: RequestInfo,
        plan: RoutePlan,
        failures: _Failures,
        budget: _Budget,
        walk: PlanWalk | None,
    ) -> AsyncGenerator[Attempt]:
        """The attempts to make, within the hop cap and budget, skipping routes a
        context-length refusal ruled out. After the plan's candidates, the walk's next model's
        plan (a pinned plan never falls back; no plan is fetched once the budget is spent). A
        candidate handed out but never attempted has its leases released here."""
        attempt = 0
        current: RoutePlan | None = plan
        while current is not None:
            candidates = current.candidates
            self.leases.hold_plan(current)
            for i, c in enumerate(candidates):
                if failures.rules_out(c):
                    await self._release(info, c)
                    continue
                hedge_backup = (
                    current is plan and i == 1 and attempt == 1 and plan.hedge_after_ms is not None
                )
                if c.pool and not c.lease_id and not c.refusal and not hedge_backup:
                    # A fallback on a capacity route: leased right before it is sent (a hedge
                    # backup only if the hedge fires: the caller's ``_leased_late``).
                    leased = await self.leases.acquire(c, info.request_id, info.prompt_estimate)
                    if leased is None:
                        continue
                    c = leased
                attempt += 1
                if not budget.may_start(attempt):
                    await self.leases.release(c)
                    await self._release_all(info, candidates, i)
                    return
                more = i + 1 < len(candidates) or (walk is not None and walk.has_more)
                yield Attempt(attempt, c, more and attempt < self._failover.max_attempts, i == 0)
            if walk is None or current.pinned or not budget.may_start(attempt + 1):
                return
            # Shielded: the next model's primary arrives leased; a client gone meanwhile must
            # not lose that plan (its lease would stay taken until the TTL), so it is held and
            # the cancellation lands on its attempt, which releases it.
            with anyio.CancelScope(shield=True):
                current = await walk.next()

    async def _release_all(
        self, info: RequestInfo, candidates: tuple[RouteCandidate, ...], start: int
    ) -> None:
        """Release the leases of ``candidates[start:]``, which will not be attempted."""
        for i in range(start, len(candidates)):
            await self._release(info, candidates[i])

    async def release_plan(self, info: RequestInfo, plan: RoutePlan) -> None:
        """Give back the leases of a plan none of whose candidates will be attempted (the
        request was refused by its caller's limits after routing), its primary's capacity
        lease included (held first: the keeper releases only leases it holds)."""
        self.leases.hold_plan(plan)
        await self._release_all(info, plan.candidates, 0)

    async def _release(self, info: RequestInfo, c: RouteCandidate) -> None:
        """Give back what a candidate that is never attempted holds: the probe lease (a
        cancelled probe observation, which releases the prefill lease too) or the model's
        prefill lease and the ModelActor's in-flight count (``FirstToken.unsent``); and its
        capacity lease. Not an attempt: the request's accounting does not count it."""
        await self.leases.release(c)
        if c.probe:
            obs = self._observation(info, c, 0, "cancelled", self._clock())
            await self._publish(subjects.observation(c.endpoint), obs)
        elif not c.refusal:
            # Also ends the in-flight count the ModelActor may hold for it (after a failure
            # it counts the next candidate as sent).
            await self._publish(
                subjects.model_first_token(info.model),
                FirstToken(endpoint=c.endpoint, request_id=info.request_id, unsent=True),
            )

    async def observe(
        self,
        info: RequestInfo,
        c: RouteCandidate,
        attempt: int,
        outcome: str,
        started: float,
        *,
        err: UpstreamError | None = None,
        ttft: float | None = None,
        usage: Usage = NO_USAGE,
        sent_chars: int = 0,
    ) -> None:
        """Publish the Observation of one attempt (never raises: accounting must not fail a
        request)."""
        obs = self._observation(
            info,
            c,
            attempt,
            outcome,
            started,
            err=err,
            ttft=ttft,
            usage=usage,
            sent_chars=sent_chars,
        )
        record = info.record
        record.attempted(obs)
        record.upstream(started, started + obs.latency_ms / 1000)
        if record.trace is not None:
            record.trace.attempt_done(obs)
        if info.on_attempt is not None:
            info.on_attempt(obs)
        await self._publish(subjects.observation(c.endpoint), obs)

    def _observation(
        self,
        info: RequestInfo,
        c: RouteCandidate,
        attempt: int,
        outcome: str,
        started: float,
        *,
        err: UpstreamError | None = None,
        ttft: float | None = None,
        usage: Usage = NO_USAGE,
        sent_chars: int = 0,
    ) -> Observation:
        now = self._clock()
        prompt, completion = usage.prompt, usage.completion
        estimated = not usage.reported and (outcome == "success" or sent_chars > 0)
        if estimated:
            prompt = info.prompt_estimate
            completion = -(-sent_chars // _CHARS_PER_TOKEN)
        cost = cost_usd(
            self._targets.pricing(c.endpoint),
            prompt_tokens=prompt,
            completion_tokens=completion,
            cache_read_tokens=usage.cached,
            cache_write_tokens=usage.cache_written,
        )
        return Observation(
            endpoint=c.endpoint,
            model=info.model,
            outcome=outcome,
            attempt=attempt,
            status=err.status if err is not None else 200,
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
            ts=self._wall(),
            prompt_estimate=info.prompt_estimate,
            role=info.role,
            trace_id=info.record.trace.trace_id if info.record.trace is not None else "",
        )

    async def _publish(self, subject: str, msg: Message) -> None:
        """Fire-and-forget; accounting must never fail (or be cancelled out of) a request."""
        try:
            with anyio.CancelScope(shield=True):
                await self._bus.publish(subject, msg)
        except GatewayError as exc:
            logger.warning("event on %s not published: %s", subject, exc)

    async def call(
        self,
        info: RequestInfo,
        plan: RoutePlan,
        op: Callable[[Adapter, UpstreamTarget], Awaitable[JSON]],
        walk: PlanWalk | None = None,
    ) -> Served:
        """Try each candidate with ``op`` until one answers (then the walk's next models').
        Raises the deterministic error."""
        failures = _Failures()
        budget = _Budget(self._failover, info.started, self._clock)
        async with aclosing(self._attempts(info, plan, failures, budget, walk)) as attempts:
            return await self._call(info, op, failures, budget, attempts, plan.hedge_after_ms)

    async def _call(
        self,
        info: RequestInfo,
        op: Callable[[Adapter, UpstreamTarget], Awaitable[JSON]],
        failures: _Failures,
        budget: _Budget,
        attempts: AsyncIterator[Attempt],
        hedge_after_ms: float | None,
    ) -> Served:
        async for planned in attempts:
            if planned.candidate.refusal:
                await self._refused(info, planned.candidate, planned.number, failures)
                continue
            a = await self._leased_late(info, planned)
            if a is None:
                continue
            backup = await self._hedge_backup(a, hedge_after_ms, attempts)
            if backup is None:
                result = await self._try_call(info, op, a, budget, Declined())
                if not isinstance(result, UpstreamError):
                    return Served(result, a.candidate, a.number)
                failures.add(result, a.candidate)
                continue
            pair = (a, backup)
            if info.record.trace is not None:
                info.record.trace.hedged(a.number, backup.number)
            raced = await hedging.race(
                functools.partial(self._try_call, info, op, a, budget),
                functools.partial(self._backup_call, info, op, backup, budget),
                hedge_after_ms or 0.0,
                discard=_nothing,
            )
            if raced.winner is not None:
                body = raced.results[raced.winner]
                assert body is not None and not isinstance(body, UpstreamError)
                won = pair[raced.winner]
                return Served(body, won.candidate, won.number)
            self._raced_failures(pair, raced.results, failures)
        raise failures.final()

    async def _hedge_backup(
        self, a: Attempt, hedge_after_ms: float | None, attempts: AsyncIterator[Attempt]
    ) -> Attempt | None:
        """The attempt to race against ``a`` (the plan's second candidate), when the plan
        asks for a hedge and ``a`` is the request's very first attempt; else None. A backup
        on a capacity route arrives unleased (see ``_attempts``): its side leases it when
        the hedge fires, so a primary that answers in time never holds a lease for it."""
        if hedge_after_ms is None or a.number != 1 or not a.first_of_plan or not a.more:
            return None
        backup = await anext(attempts, None)
        if backup is None or backup.candidate.refusal:
            return None  # a refused route is accounted by the loop's next turn, not raced
        return backup

    async def _leased_late(self, info: RequestInfo, a: Attempt) -> Attempt | None:
        """``a`` with its capacity lease. Only a plan's hedge backup arrives unleased from
        ``_attempts``; leased here like any fallback, right before it is sent. None when
        its pool refuses (the route is skipped)."""
        c = a.candidate
        if not c.pool or c.lease_id or c.refusal:
            return a
        leased = await self.leases.acquire(c, info.request_id, info.prompt_estimate)
        return None if leased is None else a._replace(candidate=leased)

    @staticmethod
    def _raced_failures(
        pair: tuple[Attempt, Attempt], results: Sequence[object], failures: _Failures
    ) -> None:
        """Record the errors of a race nobody won (a backup its pool refused is none)."""
        for side, res in zip(pair, results, strict=True):
            if isinstance(res, UpstreamError) and res.kind != _NO_BACKUP:
                failures.add(res, side.candidate)

    async def _backup_call(
        self,
        info: RequestInfo,
        op: Callable[[Adapter, UpstreamTarget], Awaitable[JSON]],
        a: Attempt,
        budget: _Budget,
        declined: Declined,
    ) -> JSON | UpstreamError:
        """The hedge's backup side: leased as it starts (refused: the primary races
        alone), then one ordinary attempt."""
        leased = await self._leased_late(info, a)
        if leased is None:
            return _no_backup(a.candidate)
        return await self._try_call(info, op, leased, budget, declined)

    async def _try_call(
        self,
        info: RequestInfo,
        op: Callable[[Adapter, UpstreamTarget], Awaitable[JSON]],
        a: Attempt,
        budget: _Budget,
        declined: Declined,
    ) -> JSON | UpstreamError:
        """One observed attempt: the answer, or the error it failed with. Its capacity
        lease is given back however it ends (with the reported tokens when known)."""
        attempt, c, more = a.number, a.candidate, a.more
        tokens: int | None = None
        trace = info.record.trace
        try:
            started = self._clock()
            target = self._targets.resolve(c)
            if trace is not None:
                target = trace.attempt(attempt, c, target, info.surface, info.stream)
            limit, by_budget = budget.first_byte_limit(attempt, target.timeout, more)
            try:
                async with asyncio.timeout(limit):
                    adapter = self._adapter(c)
                    if trace is not None:
                        adapter = trace.noting(adapter, attempt)
                    body = await op(adapter, target)
            except UpstreamError as err:
                await self.leases.release(c, tokens_used_by_failure(err))
                await self.observe(info, c, attempt, _outcome_of(err), started, err=err)
                return err
            except TimeoutError:
                timeout = _timed_out(c, limit, by_budget)
                outcome = "cancelled" if by_budget else "failure"
                await self.observe(info, c, attempt, outcome, started, err=timeout)
                return timeout
            except (anyio.get_cancelled_exc_class(), RecursionError):
                # RecursionError: a body nested just short of the decode limit cannot be
                # encoded again for the upstream; the app refuses it (400), but the attempt
                # must still end here, or its prefill and probe leases are never given back.
                await self.observe(
                    info, c, attempt, "cancelled", started, err=declined.error(c.endpoint)
                )
                raise
            usage = usage_of(body)
            await self.observe(
                info,
                c,
                attempt,
                "success",
                started,
                usage=usage,
                sent_chars=0 if usage.reported else content_chars(body),
            )
            tokens = _tokens(usage)
            return body
        finally:
            await self.leases.release(c, tokens)  # a no-op once released above

    async def open_stream(
        self, info: RequestInfo, plan: RoutePlan, body: JSON, walk: PlanWalk | None = None
    ) -> StreamAttempt:
        """Start a stream on the first candidate that yields a first chunk (then the walk's
        next models'). Raises the deterministic error when none does."""
        failures = _Failures()
        budget = _Budget(self._failover, info.started, self._clock)
        async with aclosing(self._attempts(info, plan, failures, budget, walk)) as attempts:
            return await self._open_stream(
                info, body, failures, budget, attempts, plan.hedge_after_ms
            )

    async def _open_stream(
        self,
        info: RequestInfo,
        body: JSON,
        failures: _Failures,
        budget: _Budget,
        attempts: AsyncIterator[Attempt],
        hedge_after_ms: float | None,
    ) -> StreamAttempt:
        async for planned in attempts:
            if planned.candidate.refusal:
                await self._refused(info, planned.candidate, planned.number, failures)
                continue
            a = await self._leased_late(info, planned)
            if a is None:
                continue
            backup = await self._hedge_backup(a, hedge_after_ms, attempts)
            if backup is None:
                result = await self._try_open(info, body, a, budget, Declined())
                if isinstance(result, StreamAttempt):
                    return result
                failures.add(result, a.candidate)
                continue
            pair = (a, backup)
            if info.record.trace is not None:
                info.record.trace.hedged(a.number, backup.number)
            raced = await hedging.race(
                functools.partial(self._try_open, info, body, a, budget, hold=True),
                functools.partial(self._backup_open, info, body, backup, budget),
                hedge_after_ms or 0.0,
                discard=_decline_stream,
            )
            if raced.winner is not None:
                stream = raced.results[raced.winner]
                assert isinstance(stream, StreamAttempt)
                return stream
            self._raced_failures(pair, raced.results, failures)
        raise failures.final()

    async def _backup_open(
        self, info: RequestInfo, body: JSON, a: Attempt, budget: _Budget, declined: Declined
    ) -> StreamAttempt | UpstreamError:
        """The hedge's backup side of a stream (as ``_backup_call``)."""
        leased = await self._leased_late(info, a)
        if leased is None:
            return _no_backup(a.candidate)
        return await self._try_open(info, body, leased, budget, declined, hold=True)

    async def _try_open(
        self,
        info: RequestInfo,
        body: JSON,
        a: Attempt,
        budget: _Budget,
        declined: Declined,
        *,
        hold: bool = False,
    ) -> StreamAttempt | UpstreamError:
        """One observed stream attempt up to its first chunk (``hold``: up to its first
        token, see ``_first_token``): the open stream (which holds the capacity lease until
        its relay ends), or the error it failed with (the lease given back)."""
        attempt, c, more, first_of_plan = a
        started = self._clock()
        target = self._targets.resolve(c)
        trace = info.record.trace
        if trace is not None:
            target = trace.attempt(attempt, c, target, info.surface, info.stream)
        try:
            adapter = self._adapter(c)
            if trace is not None and trace.capturing:
                adapter = trace.noting(adapter, attempt)
            chunks = adapter.stream(target, body)
        except UpstreamError as missing:  # no adapter: nothing sent, the next may serve
            await self.observe(info, c, attempt, "failure", started, err=missing)
            await self.leases.release(c, tokens_used_by_failure(missing))
            return missing
        limit, by_budget = budget.first_byte_limit(attempt, target.ttft_timeout, more)
        outcome = "failure"
        try:
            async with asyncio.timeout(limit):
                first = await anext(chunks)
                if hold:
                    first = await _first_token(first, chunks, target.idle_timeout, c.endpoint)
        except StopAsyncIteration:
            err = UpstreamError(
                "upstream stream was empty", endpoint=c.endpoint, kind="empty_stream"
            )
        except UpstreamError as exc:
            err = exc
            outcome = _outcome_of(err)
        except TimeoutError:
            err = _timed_out(c, limit, by_budget)
            outcome = "cancelled" if by_budget else "failure"
        except (anyio.get_cancelled_exc_class(), RecursionError):
            # RecursionError: see _try_call (the body cannot be encoded for the upstream).
            await _aclose(chunks)
            await self.observe(
                info, c, attempt, "cancelled", started, err=declined.error(c.endpoint)
            )
            await self.leases.release(c)
            raise
        else:
            info.record.upstream(started, self._clock())
            if trace is not None and first:
                trace.answered(attempt, first[0])
            if first_of_plan:  # only a plan's primary holds its model's prefill lease
                await self._publish(
                    subjects.model_first_token(info.model),
                    FirstToken(
                        endpoint=c.endpoint,
                        request_id=info.request_id,
                        spent_for=first.spent_for if isinstance(first, Batch) else None,
                    ),
                )
            if c.probe:  # the probe's verdict is its first byte, not the stream's end
                await self._publish(
                    subjects.endpoint_probe_result(c.endpoint),
                    ProbeFirstByte(endpoint=c.endpoint, request_id=info.request_id),
                )
            return StreamAttempt(
                self, info, c, attempt, started, first, chunks, target.idle_timeout
            )
        await _aclose(chunks)
        await self.observe(info, c, attempt, outcome, started, err=err)
        await self.leases.release(c, tokens_used_by_failure(err))
        return err

    async def _refused(
        self, info: RequestInfo, c: RouteCandidate, attempt: int, failures: _Failures
    ) -> None:
        """A route whose key pool refused the caller: nothing is sent. A plain exhaustion is
        the endpoint's failure; a reservation-only refusal is not observed at all."""
        cls = (
            KeyPoolRoleRestrictedError
            if c.refusal == KeyPoolRoleRestrictedError.code
            else KeyPoolExhaustedError
        )
        err = cls(
            f"no upstream key of {c.endpoint} is available to this caller",
            endpoint=c.endpoint,
            retry_after=c.retry_after,
            kind=c.refusal,
        )
        if err.counts_against_endpoint:
            await self.observe(info, c, attempt, "failure", self._clock(), err=err)
        failures.add(err, c)

    def _adapter(self, c: RouteCandidate) -> Adapter:
        adapter = self._adapters.get(c.kind)
        if adapter is None:
            raise UpstreamError(
                f"no adapter for upstream kind {c.kind!r}", endpoint=c.endpoint, kind="no_adapter"
            )
        return adapter


_NO_BACKUP = "hedge_backup_refused"


def _no_backup(c: RouteCandidate) -> UpstreamError:
    """A hedge backup whose pool refused its lease: it never ran (not a failure)."""
    return UpstreamError(
        "hedge backup not sent: its capacity pool refused a lease",
        endpoint=c.endpoint,
        kind=_NO_BACKUP,
    )


async def _nothing(_body: JSON) -> None:
    """A whole answer that lost a hedge race holds nothing to release."""


async def _decline_stream(stream: StreamAttempt) -> None:
    """A stream that lost a hedge race after its first chunk: closed, observed declined."""
    await stream.close(
        "cancelled",
        UpstreamError(
            "declined: the hedged twin answered first",
            endpoint=stream.candidate.endpoint,
            kind=hedging.DECLINED,
        ),
    )


def _merged_refusal(errors: list[UpstreamError]) -> UpstreamError:
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


def _tokens(usage: Usage) -> int | None:
    """Prompt plus completion tokens an upstream reported; None when it reported none."""
    total = usage.prompt + usage.completion
    return total or None


def _timed_out(c: RouteCandidate, limit: float, by_budget: bool) -> UpstreamTimeoutError:
    why = "the request's failover budget ran out" if by_budget else f"no answer in {limit:g} s"
    return UpstreamTimeoutError(
        f"upstream timed out before its first byte: {why}",
        endpoint=c.endpoint,
        kind="budget" if by_budget else "ttft",
    )


def _answers(batch: Batch) -> bool:
    """Whether ``batch`` says something of the answer: a token, a finish reason, or the end."""
    return batch.last or any(
        carries_token(chunk)
        or any(
            isinstance(ch, dict) and ch.get("finish_reason") for ch in chunk.get("choices") or ()
        )
        for chunk in batch
    )


async def _first_token(
    first: Batch, rest: AsyncIterator[Batch], idle: float, endpoint: str
) -> Batch:
    """``first`` and the batches after it, up to the first that ``_answers``, as one batch
    (chunks unchanged, in order). A hedged stream is decided by its first token, not by a
    role-only first chunk an upstream sends at once and then stalls after; nothing of it
    has reached the client yet, so a failure here leaves the race to the other side. The
    caller's first-byte limit bounds the whole wait; ``idle`` bounds each read, as after
    commit. Raises UpstreamError (the stream broke, stalled, or ended without an answer)."""
    held = list(first)
    batch = first
    while not _answers(batch):
        try:
            async with asyncio.timeout(idle):
                batch = await anext(rest)
        except StopAsyncIteration:
            raise UpstreamError(
                "upstream stream ended before its first token", endpoint=endpoint, kind="truncated"
            ) from None
        except TimeoutError:
            raise UpstreamTimeoutError(
                f"upstream stream stalled before its first token: no chunk for {idle:g} s",
                endpoint=endpoint,
                kind="idle",
            ) from None
        held += batch
    return first if len(held) == len(first) else Batch(held, last=batch.last)


async def _aclose(gen: AsyncIterator[Any]) -> None:
    aclose = getattr(gen, "aclose", None)
    if aclose is not None:
        with anyio.CancelScope(shield=True):
            await aclose()


class StreamAttempt:
    """A committed stream: its first batch of chunks, the rest, and its observation when it
    ends."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        info: RequestInfo,
        candidate: RouteCandidate,
        attempt: int,
        started: float,
        first: Batch,
        rest: AsyncIterator[Batch],
        idle_timeout: float,
    ) -> None:
        self.candidate = candidate
        self.attempt = attempt
        self.first = first
        self._rest = rest
        self._dispatcher = dispatcher
        self._info = info
        self._started = started
        self._ttft: float | None = None  # when the first token (or the end) arrived
        self._usage = NO_USAGE
        self._chars = 0  # content sent, for the estimate when no usage is reported
        self._finished = False
        self._idle = idle_timeout
        self._note(first)

    async def batches(self) -> AsyncIterator[Batch]:
        """Every batch of chunks (what one upstream read carried), the first included, up to
        the ``last`` one. Raises UpstreamError if the stream breaks, stalls for the idle
        timeout, or ends without a finish reason."""
        yield self.first
        batch = self.first
        while not batch.last:
            try:
                async with asyncio.timeout(self._idle):
                    batch = await anext(self._rest)
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise UpstreamTimeoutError(
                    f"upstream stream stalled: no chunk for {self._idle:g} s",
                    endpoint=self.candidate.endpoint,
                    kind="idle",
                ) from None
            self._note(batch)
            yield batch
        if not self._finished:
            # A clean end that never said why the answer stopped may be cut short.
            raise UpstreamError(
                "upstream stream ended without a finish reason",
                endpoint=self.candidate.endpoint,
                kind="truncated",
            )

    def _note(self, batch: Batch) -> None:
        """Keep the latest usage, the characters sent, whether a choice has said why it
        stopped, and when the first token came (a role-only chunk is none; an answer that
        ends without any token has its TTFT at its end)."""
        if self._ttft is None and _answers(batch):
            self._ttft = self._dispatcher.now()
        for chunk in batch:
            if chunk.get("usage"):
                self._usage = usage_of(chunk)
            for choice in chunk.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    self._chars += len(content)
                if not self._finished and choice.get("finish_reason"):
                    self._finished = True
                    if self._info.record.trace is not None:
                        self._info.record.trace.finished(self.attempt, choice["finish_reason"])

    async def close(self, outcome: str, err: UpstreamError | None = None) -> None:
        """Release the upstream stream and the capacity lease, and publish this attempt's
        observation (closing twice releases once)."""
        await _aclose(self._rest)
        await self._dispatcher.leases.release(self.candidate, _tokens(self._usage))
        await self._dispatcher.observe(
            self._info,
            self.candidate,
            self.attempt,
            outcome,
            self._started,
            err=err,
            ttft=self._ttft,
            usage=self._usage,
            sent_chars=self._chars,
        )
