"""ModelLoad: a ModelActor's count of each route's requests in flight and its learned
concurrency limit (actors/state/route_load.py, learned_limit.py), what it tells operators of
them, and how the ``fixed`` router spills past a route at its limit.

The ModelActor issues every plan and sees every observation, so all of this is kept without
a bus message on the happy path; a limit change is published as ``RouteCapacity`` on
``llmgw.events.capacity`` (cuts at once, growth in whole steps at most once a second).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import msgspec

from actors.state.route_load import RouteLoad
from schemas import (
    HEDGE_DECLINED,
    RATE_LIMIT_EXCEEDED,
    RouteCapacity,
    RouteSkip,
    is_backpressure,
    priced_tokens,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.state.rate_pace import Asked
    from actors.state.route_table import RouteEntry
    from schemas import Observation, RoutePlan, RouteRequest, RouteStatus
    from schemas.config import ModelConfig, RoutingConfig
    from schemas.routing import RateReport

_GROWTH_EVENT_SECONDS = 1.0
_NEVER = -math.inf


class ModelLoad:
    """Owns one model's RouteLoad and the bookkeeping of its capacity events."""

    def __init__(
        self,
        model: ModelConfig,
        routing: RoutingConfig,
        clock: Callable[[], float],
        keys_of: Callable[[str], tuple[str, ...]] = lambda _: (),
    ) -> None:
        learned = routing.learned_capacity
        # A count is forgotten after the longest a request of this model may run (its
        # slowest route's timeout, plus the failover budget): a lost observation heals then.
        ttl = max((r.timeout_seconds for r in model.route), default=600.0)
        self._model = model.id
        self.load = RouteLoad(
            {
                eid: r.concurrency.limit if r.concurrency is not None else None
                for eid, r in zip(model.endpoint_ids(), model.route, strict=True)
            },
            ttl=ttl + routing.failover.budget_seconds,
            min_limit=learned.min_limit,
            inflation=learned.ttft_inflation,
            pacing=learned.pace_rate_limits,
            keys_of=keys_of,
            default_caps={
                eid: cap
                for eid, r in zip(model.endpoint_ids(), model.route, strict=True)
                if (cap := r.default_max_tokens) is not None
            },
        )
        self._published: dict[str, tuple[float, int]] = {}  # endpoint -> (ts, whole limit)
        # What the request being decided asks (prompt tokens, output cap, thinking budget),
        # when its size is to be checked against token limits (None: none was reported).
        self._asked: Asked | None = None
        self._clock = clock
        # ``of`` is read for every route of every RouteWise decision: its look-ups, bound once
        self._limits = self.load.limits
        self._in_flight = self.load.counts.get

    def of(self, endpoint: str) -> tuple[int, float | None]:
        """(in flight, the concurrency it takes now or None) of ``endpoint`` (what a strategy
        reads): its learned limit, else its slow-start window; what is in flight while its
        provider said its limit is spent."""
        lim = self._limits.get(endpoint)
        in_flight = self._in_flight(endpoint, 0)
        if lim is None:
            return in_flight, None
        # The clock only when a provider ever said its limit was spent (-inf: never).
        if lim.spent_until != _NEVER and self._clock() < lim.spent_until:
            return in_flight, float(in_flight)
        return in_flight, lim.window if lim.limit is None else lim.limit  # lim.bound(), inline

    def spent(self, endpoint: str, seconds: float) -> None:
        """An answer said ``endpoint``'s limit is spent for ``seconds`` (its
        ``x-ratelimit-remaining-*``, or with pacing off its rate report): it is at its limit
        until then (spilled past, left out of RouteWise)."""
        self.load.spent(endpoint, self._clock() + seconds)

    def reported(self, endpoint: str, key: str, request_id: str, report: RateReport) -> None:
        """An answer of ``endpoint`` with ``key`` to ``request_id`` reported its rate limits'
        state: what the model sends that key is paced by it (the route is at its limit while
        none of its keys has a request left, and passed over by a request whose tokens none
        of them has room for)."""
        self.load.reported(request_id, endpoint, key, report, self._clock())

    def deciding(self, asked: Asked) -> None:
        """The plan decided next is for a request asking ``asked`` (its prompt tokens, output
        cap and thinking budget): a route (:meth:`spill`, :meth:`skipped`) or a key
        (:meth:`key_spent`) whose token limit has no room for it is passed over."""
        self._asked = asked if self.load.paces.tokens_paced else None

    def key_spent(self, endpoint: str, key: str, now: float) -> bool:
        """Whether ``endpoint``'s ``key`` has nothing left at ``now`` by its paces, or too
        little of its token limit for the request being decided (:meth:`deciding`)."""
        paces = self.load.paces
        if paces.key_spent(endpoint, key, now):
            return True
        asked = self._asked
        if asked is None:
            return False
        return paces.key_room_at(endpoint, key, paces.room_needed(endpoint, *asked), now) > now

    def keys_changed(self, endpoint: str) -> None:
        """``endpoint``'s pool declares other keys now (see ``RoutePaces.refresh``)."""
        self.load.paces.refresh(endpoint)

    @property
    def pacing(self) -> bool:
        """Whether reported rate limits pace routes (``learned_capacity.pace_rate_limits``)."""
        return self.load.paces.enabled

    def issued(self, request_id: str, plan: RoutePlan, now: float, req: RouteRequest) -> None:
        """A live plan was answered: its primary is in flight (``req``, of its size)."""
        sendable = tuple(c.endpoint for c in plan.candidates if not c.refusal)
        asked = (req.prompt_tokens, req.output_cap, req.thinking_budget)
        # The ingress hedges a primary with the plan's second candidate.
        hedge = sendable[1] if plan.hedge_after_ms is not None and len(sendable) > 1 else ""
        self.load.issued(request_id, sendable, now, plan.candidates, asked, hedge)

    def unsent(self, request_id: str, endpoint: str) -> None:
        """The ingress will not send ``request_id`` to ``endpoint`` (``FirstToken.unsent``)."""
        self.load.unsent(request_id, endpoint, self._clock())

    def observed(self, obs: Observation, now: float) -> RouteCapacity | None:
        """Fold one attempt's observation; the event to publish when a limit changed."""
        if obs.attempt == 0:  # a probe candidate given back unattempted: as never sent
            self.load.unsent(obs.request_id, obs.endpoint, now)
            return None
        at_send, _ = self.load.observed(
            obs.request_id,
            obs.endpoint,
            obs.outcome,
            now,
            committed=obs.committed,
            lost_race=obs.error_kind == HEDGE_DECLINED,
        )
        limit = self.load.limits.get(obs.endpoint)
        changed = False
        if limit is not None and is_backpressure(obs):
            # A refused pace (its headers said a rate is metered) is no concurrency: cooling
            # keeps the pace, and a route whose long answers a rate limits, halved, would run
            # at half its rate. A 429 that does not say which may be a concurrency plan's.
            if obs.error_kind != RATE_LIMIT_EXCEEDED:
                sent_with = at_send if at_send >= 0 else self.load.in_flight(obs.endpoint)
                changed = limit.rate_limited(sent_with, now)
        elif obs.outcome == "success" and at_send >= 0 and not obs.probe:
            ttft = obs.ttft_ms if obs.ttft_ms is not None else obs.latency_ms
            changed = self.load.succeeded(obs.endpoint, ttft, at_send, now, obs.latency_ms)
            self.load.paces.answered(priced_tokens(obs)[1])
        return self._event(obs.endpoint, now) if changed else None

    def _event(self, endpoint: str, now: float) -> RouteCapacity | None:
        lim = self.load.limits[endpoint]
        limit = lim.effective()
        if limit is None:
            return None
        last_ts, last_whole = self._published.get(endpoint, (-1e18, -1))
        if lim.reason == "grew" and (
            int(limit) == last_whole or now - last_ts < _GROWTH_EVENT_SECONDS
        ):
            return None
        self._published[endpoint] = (now, int(limit))
        return RouteCapacity(
            model=self._model,
            endpoint=endpoint,
            limit=round(limit, 3),
            in_flight=self.load.in_flight(endpoint),
            reason=lim.reason,
            cap=lim.cap,
            ttft_baseline_ms=lim.baseline_ms,
            ttft_recent_ms=lim.recent_ms,
            ts=now,
        )

    def _room_at(self, endpoint: str, now: float) -> float:
        """When ``endpoint`` has room for the request being decided (-inf: now)."""
        if self._asked is None:
            return _NEVER
        paces = self.load.paces
        return paces.room_at(endpoint, paces.room_needed(endpoint, *self._asked), now)

    @property
    def tokens_paced(self) -> bool:
        """Whether a route's answers reported a token limit (plans then spill for tokens)."""
        return self.load.paces.tokens_paced

    def spill(
        self,
        drawn: list[RouteEntry],
        backups: list[RouteEntry],
        available: Callable[[RouteEntry], bool],
        *,
        saturated: bool = True,
    ) -> tuple[list[RouteEntry], list[RouteEntry], list[RouteEntry]]:
        """``fixed`` spills before a route saturates: a route at its learned limit leaves the
        draw for the next in weight order (the backups at their limit go after the others);
        the drawn ones at their limit are kept last among the fallbacks. Weights are an
        intent that load bends, never a queue. It spills past a route whose token limit has
        less left than the request being decided may take (:meth:`deciding`) too, and
        RouteWise's plans (``saturated`` False) past those only. When no
        ``available`` route is under its limit, nothing spills (the limit is an estimate,
        not a refusal).

        Returns (drawn, backups, spilled)."""
        load = self.load
        now = self._clock()
        routes = (*drawn, *backups)
        full = {r.endpoint for r in routes if saturated and load.saturated(r.endpoint, now)}
        if self._asked is not None:
            full.update(r.endpoint for r in routes if self._room_at(r.endpoint, now) > now)
        if not full or not any(available(r) and r.endpoint not in full for r in (*drawn, *backups)):
            return drawn, backups, []
        spilled = [r for r in drawn if r.endpoint in full and available(r)]
        drawn = [r for r in drawn if r.endpoint not in full]
        backups = sorted(backups, key=lambda r: r.endpoint in full)  # stable: declared order
        return drawn, backups, spilled

    def skipped(self, r: RouteEntry) -> RouteSkip:
        """What the plan says of ``r``, spilled for capacity: its provider's reported rate
        limit spent, or too little of its token limit left for the request being decided
        (until when), else its learned concurrency limit reached."""
        now = self._clock()
        until = max(self.load.limits[r.endpoint].spent_until, self._room_at(r.endpoint, now))
        if until != _NEVER and until > now:
            in_flight = self.load.in_flight(r.endpoint)
            return RouteSkip(
                endpoint=r.endpoint, reason="rate_limit", until=until, in_flight=in_flight
            )
        return RouteSkip(
            endpoint=r.endpoint,
            reason="capacity",
            limit=self.load.limits[r.endpoint].effective(),
            in_flight=self.load.in_flight(r.endpoint),
        )

    def status(self, r: RouteStatus, cooling_until: float | None) -> RouteStatus:
        """``r`` with its count, learned limit and what moved it, its cooling, and until when
        its provider's reported rate limit is spent."""
        lim = self.load.limits.get(r.endpoint)
        if lim is None:
            return r
        now = self._clock()
        # A token limit without room for the smallest request spends it as much.
        paces = self.load.paces
        until = max(lim.spent_until, paces.room_at(r.endpoint, paces.smallest(), now))
        spent = until if until > now else None
        return msgspec.structs.replace(
            r,
            in_flight=self.load.in_flight(r.endpoint),
            learned_limit=lim.effective(),
            limit_reason=lim.reason,
            ttft_baseline_ms=lim.baseline_ms,
            ttft_recent_ms=lim.recent_ms,
            cooling_until=cooling_until,
            rate_limit_until=spent,
        )
