"""``routewise``: effective cost -> cost-budgeted mean-TTFT LP -> one sampled primary.

Per request, over the admissible routes the ModelActor hands in (weight > 0, circuit admits,
not benched, key pool serves the caller, modality and context fit):

1. effective cost: on-demand routes the cold-cache price of the prompt plus the predicted
   completion (route ``pricing:``); quota routes the exponential shadow price of the pool's
   used fraction between the cost envelope's ``L`` and ``U``; concurrency routes nothing
   while a slot is free. A quota route whose pool has not resolved, or whose envelope is not
   calibrated yet, is masked; a full pool (quota or slots) is infeasible.
2. the LP at budget ``c_min + alpha * (c_fast - c_min)`` (``c_fast`` the fastest feasible
   route's cost), objective the mean TTFT (live window, else history, else the unprofiled
   default; ties broken on cost; a 429 is back-pressure, not a failure's TTFT).
3. the primary sampled from the LP's mix; the fallbacks are the LP re-solved without the
   routes already placed (``fallback_order``), so a retryable failure moves on to what the
   policy would choose without the failed endpoint.

When nothing is feasible (a cold burst: every candidate masked or full) the library's
``NoProviderError`` is caught and the request falls back to the fixed weighted draw over
the same candidates; never an error to the client.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any, cast

from llm_routewise import NoProviderError
from llm_routewise.const import DISPATCH_OVERHEAD_MS, HEDGE_SUCCESS_TARGET
from llm_routewise.core.hedging import (
    EPS,
    combined_success_probability,
    hedge_checkpoints_for_slo,
)

from actors.strategies.base import RoutingStrategy
from actors.strategies.routewise.candidates import Candidate, Row, route_rows, weighted
from actors.strategies.routewise.evidence import (
    CostEnvelope,
    LatencyEvidence,
    OutputLengthPredictor,
    TtftWindow,
)
from actors.strategies.routewise.host import RouteWiseHost
from actors.strategies.routewise.solutions import Solutions
from schemas.pricing import Pricing, uncached_cost
from schemas.routing import is_backpressure, is_backpressure_row

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

    from actors.strategies.base import RouteView, StrategyDeps, StrategyHost
    from actors.strategies.routewise.params import RouteWiseParams
    from schemas import Observation, RouteRequest
    from schemas.config import ModelConfig

logger = logging.getLogger(__name__)

# Samples each route needs before hedging trusts its profile (the library's default).
HEDGE_MIN_SAMPLES = 5


def reference_pricing(model: ModelConfig | None, params: RouteWiseParams) -> Pricing | None:
    """What the envelope prices requests at: ``reference_api_price``, else the cheapest
    priced on-demand route of the model."""
    if params.reference_api_price is not None:
        return params.reference_api_price
    if model is None:
        return None
    priced = [
        r.pricing for r in model.route if r.provider_type == "on_demand" and r.pricing is not None
    ]
    return min(priced, key=lambda p: p.prompt + p.completion, default=None)


def startup_problem(model: ModelConfig, params: RouteWiseParams) -> str | None:
    """Why ``model`` cannot start under RouteWise, or None. A model whose every route is a
    quota route has no traffic to calibrate its cost envelope from."""
    if not model.route or any(r.provider_type != "quota" for r in model.route):
        return None
    if params.envelope_bootstrap_donor_models or params.reference_api_price is not None:
        return None
    return (
        f"model {model.id!r} has only quota routes, so RouteWise cannot calibrate its "
        "cost envelope: add an on-demand route, or set router_params "
        "envelope_bootstrap_donor_models (models serving the same workload) or "
        "reference_api_price"
    )


class RouteWiseStrategy(RoutingStrategy):
    """The RouteWise policy of one model. Owns its evidence (latency profiles, output
    lengths, cost envelope) and a view of its routes' capacity pools. Never raises from
    ``select``: a cold burst falls back to the weighted draw."""

    session_affinity = False  # the LP's mix is the policy; a pin would override it
    orders_fallbacks = True  # the LP re-solved without the routes before
    reads_backlog = False  # queueing is priced from the load's in-flight counts

    @staticmethod
    def startup_problem(model: ModelConfig, params: RouteWiseParams) -> str | None:
        """Why ``model`` cannot start (see the module function)."""
        return startup_problem(model, params)

    def __init__(self, params: RouteWiseParams, deps: StrategyDeps) -> None:
        self.params = params
        self._deps = deps
        self._clock: Callable[[], float] = deps.clock
        # An explicit ``random_seed`` wins; else the host's seeded source (the replay's).
        seeded = params.random_seed is None and deps.rng is not None
        self._rng = (
            deps.rng if seeded and deps.rng is not None else random.Random(params.random_seed)
        )
        # Its own stream: exploring never shifts the LP's seeded draws.
        self._explore_rng = random.Random(self._rng.random() if seeded else params.random_seed)
        self.explored = 0
        self.latency = LatencyEvidence(params)
        self.output = OutputLengthPredictor(params)
        self.envelope = CostEnvelope(params)
        self._reference = reference_pricing(deps.model, params)
        self._endpoints = set(deps.model.endpoint_ids()) if deps.model else set()
        self._probing: dict[str, float] = {}  # endpoint -> when its probe counts as lost
        self._solutions = Solutions(params.budget_alpha)
        self.fallback_draws = 0
        # The last decision (explain and tests read it; fallback_order reuses it): its
        # request, rows and weights, the key its LP was cached under (None: no LP, a cold
        # burst's draw), which rows were in that LP (None: all) and the row it chose: set
        # by ``select`` alone.
        self._last_request: RouteRequest | None = None
        self._last_rows: list[Row] = []
        self._last_weights: Mapping[int, float] = {}
        self._last_key: bytes | None = None
        self._last_live: tuple[int, ...] | None = None
        self._last_pick = 0
        self.last_prompt_tokens = 0  # what /health/deep prices its candidate rows for

    @property
    def single_route(self) -> bool:
        """``fallback_mode: strict``: the plan holds the primary only."""
        return self.params.fallback_mode == "strict"

    def host(self, model: ModelConfig, clock: Callable[[], float]) -> StrategyHost:
        """Its host: settings, bootstrap, latency samples, probe rounds, candidate rows."""
        return RouteWiseHost(self, model, clock)

    def retune(self, params: RouteWiseParams) -> None:
        """Apply changed settings (admin overrides) from the next decision on. Evidence is
        kept; a changed latency or envelope window applies to profiles created later."""
        if params == self.params:
            return
        if params.random_seed != self.params.random_seed:
            self._rng = random.Random(params.random_seed)
            self._explore_rng = random.Random(params.random_seed)
        self.params = params
        for part in (self.latency, self.output, self.envelope):
            part.retune(params)
        self._reference = reference_pricing(self._deps.model, params)
        self._solutions.retune(params.budget_alpha)

    # -- views fed by the host ---------------------------------------------------------

    def observe(self, obs: Observation) -> None:
        """Learn TTFT, success and output length from one attempt of this model."""
        ts = obs.ts or self._clock()
        outcome = obs.outcome
        if outcome == "success":
            if obs.endpoint in self._endpoints:
                first = _first_token_ms(obs.ttft_ms, obs.latency_ms)
                self.latency.answered(obs.endpoint, first, obs.latency_ms, ts)
            self._answered(obs.prompt_tokens, obs.completion_tokens, ts, own=True)
        elif outcome == "failure" and obs.endpoint in self._endpoints and not is_backpressure(obs):
            self.latency.failure(obs.endpoint, obs.error_kind, ts)  # a 429 cools, not sickens

    def bootstrap(self, rows: Iterable[Mapping[str, Any]], *, own: bool = True) -> int:
        """Replay request-log attempt rows (the StoreActor's ``log query`` answer) with their
        own timestamps; ``own`` False for donor models' rows (envelope and global output
        length only). Returns how many rows were used."""
        used = 0
        for row in rows:
            if row.get("kind", "attempt") != "attempt" or is_backpressure_row(row):
                continue
            self._learn(
                str(row.get("endpoint", "")),
                str(row.get("outcome", "")),
                _first_token_ms(row.get("ttft_ms"), row.get("latency_ms")),
                str(row.get("error_kind", "")),
                int(row.get("prompt_tokens") or 0),
                int(row.get("completion_tokens") or 0),
                float(row["ts"]),
                own=own,
            )
            used += 1
        return used

    def _learn(
        self,
        endpoint: str,
        outcome: str,
        ttft_ms: float | None,
        error_kind: str,
        prompt_tokens: int,
        completion_tokens: int,
        ts: float,
        *,
        own: bool,
    ) -> None:
        if outcome == "success":
            if own and ttft_ms is not None and endpoint in self._endpoints:
                self.latency.success(endpoint, float(ttft_ms), ts)
            self._answered(prompt_tokens, completion_tokens, ts, own=own)
        elif outcome == "failure" and own and endpoint in self._endpoints:
            self.latency.failure(endpoint, error_kind, ts)

    def _answered(self, prompt_tokens: int, completion_tokens: int, ts: float, own: bool) -> None:
        """Learn an answer's output length and what it cost at on-demand prices."""
        self.output.update(prompt_tokens, completion_tokens, own=own)
        if self._reference is not None and (prompt_tokens or completion_tokens):
            self.envelope.add(uncached_cost(self._reference, prompt_tokens, completion_tokens), ts)

    def sample(self, endpoint: str, ok: bool, ttft_ms: float | None, ts: float) -> None:
        """A prober's measurement (LatencySample) of one of this model's routes."""
        self._probing.pop(endpoint, None)
        if endpoint not in self._endpoints:
            return
        if ok and ttft_ms is not None:
            self.latency.success(endpoint, ttft_ms, ts)
        elif not ok:
            self.latency.failure(endpoint, "probe", ts)

    def probe_due(self, endpoints: Sequence[str], now: float) -> list[str]:
        """Which of ``endpoints`` the active prober should measure now: never measured ones
        first, then (all, or with ``routewise_probe_idle_only`` only those idle for
        ``routewise_probe_idle_threshold_sec``) the stalest, at most
        ``routewise_probe_max_concurrency`` in flight. Marks them in flight."""
        p = self.params
        if not p.routewise_probe_enabled:
            return []
        self._probing = {e: t for e, t in self._probing.items() if t > now}
        room = p.routewise_probe_max_concurrency - len(self._probing)
        seen = self.latency.last_seen
        due = [
            e
            for e in endpoints
            if e not in self._probing
            and (
                not p.routewise_probe_idle_only
                or e not in seen
                or now - seen[e] >= p.routewise_probe_idle_threshold_sec
            )
        ]
        due.sort(key=lambda e: seen.get(e, float("-inf")))
        picked = due[: max(0, room)]
        for e in picked:
            self._probing[e] = now + p.routewise_probe_timeout_sec
        return picked

    def hedge_after_ms(self, primary: str, backup: str) -> float | None:
        """``latency_hedge_mode: probability_target``: the first of the SLO's checkpoints at
        which the primary alone is unlikely to meet the SLO (below the library's success
        target, failures counted as misses) and sending ``backup`` too makes it likelier;
        None when hedging is off, either route has too few samples, or no checkpoint does.

        A primary still waiting at a checkpoint is given P(first token by the SLO | none by
        the checkpoint) from its history. When every sample finished before the checkpoint,
        that history says nothing about a primary still waiting (a stall): as in the library
        (``combined_success_probability``), it gets no chance of its own, so the backup is
        raced there whenever the backup can still meet the SLO."""
        p = self.params
        if p.latency_hedge_mode != "probability_target":
            return None
        now = self._clock()
        first, second = self.latency.window(primary), self.latency.window(backup)
        if (
            first is None
            or second is None
            or min(self.latency.samples(primary, now), self.latency.samples(backup, now))
            < HEDGE_MIN_SAMPLES
        ):
            return None
        slo = p.latency_slo_sec * 1000.0

        def cdf_of(window: TtftWindow) -> Callable[[float], float]:
            return lambda ms: window.cdf_counting_errors(ms, now) or 0.0

        primary_cdf, backup_cdf = cdf_of(first), cdf_of(second)
        for checkpoint in hedge_checkpoints_for_slo(slo):
            at = checkpoint * 1000.0
            survival = 1.0 - primary_cdf(at)
            alone = 0.0 if survival <= EPS else (primary_cdf(slo) - primary_cdf(at)) / survival
            if alone >= HEDGE_SUCCESS_TARGET:
                continue
            hedged = combined_success_probability(
                primary_cdf,
                backup_cdf,
                elapsed_ms=at,
                slo_ms=slo,
                dispatch_overhead_ms=DISPATCH_OVERHEAD_MS,
            )
            if hedged > alone:
                return at
        return None

    # -- the decision ------------------------------------------------------------------

    def candidates(
        self, routes: Sequence[RouteView], request: RouteRequest, now: float
    ) -> list[Candidate]:
        """Effective cost and latency of every route (masked ones with ``excluded``)."""
        return [Candidate(*r) for r in self._rows(routes, request, now)]

    def _rows(self, routes: Sequence[RouteView], request: RouteRequest, now: float) -> list[Row]:
        prompt = request.prompt_tokens
        completion = round(self.output.predict(prompt))
        bounds = self.envelope.bounds(now)
        return route_rows(routes, prompt, completion, bounds, now, self.latency, self._deps)

    def _one(self, route: RouteView, request: RouteRequest) -> Row:
        return self._rows((route,), request, self._clock())[0]

    def solve(self, cands: Sequence[Candidate]) -> dict[int, float]:
        """LP weights by index into ``cands`` (only unmasked ones get weight). Raises
        NoProviderError when every candidate is masked or infeasible."""
        return self._solve(
            [c.effective_cost for c in cands],
            [c.latency_ms for c in cands],
            lambda: ", ".join(f"{c.endpoint}: {c.excluded}" for c in cands),
        )

    def _solve(
        self, costs: Sequence[float | None], latencies: Sequence[float], why: Callable[[], str]
    ) -> dict[int, float]:
        """The LP's weights by position (the cached solution itself when every route is in
        the LP: read only)."""
        if None not in costs:  # every route in the LP (the common case): no positions to map
            return self._solutions.weights(cast("Sequence[float]", costs), latencies)
        live = [i for i, c in enumerate(costs) if c is not None]
        if not live:
            raise NoProviderError(f"no feasible RouteWise candidate ({why()})")
        weights = self._solutions.weights(
            [float(costs[i] or 0.0) for i in live], [latencies[i] for i in live]
        )
        return {live[k]: w for k, w in weights.items()}

    def _sample(self, weights: Mapping[int, float]) -> int:
        x = self._rng.random()
        pick = next(iter(weights))
        for i, w in weights.items():
            pick = i
            x -= w
            if x < 0:
                break
        return pick

    def select(self, routes: Sequence[RouteView], request: RouteRequest) -> RouteView:
        """The primary: sampled from the LP's mix; the weighted draw on a cold burst."""
        self.last_prompt_tokens = request.prompt_tokens
        if len(routes) == 1:
            return routes[0]
        rows = self._rows(routes, request, self._clock())
        self._last_request, self._last_rows, self._last_weights = request, rows, {}
        self._last_key = None
        costs = [r[2] for r in rows]
        try:
            weights = self._solve(costs, [r[3] for r in rows], lambda: _reasons(rows))
        except NoProviderError as exc:
            self.fallback_draws += 1
            logger.debug("routewise cold burst, weighted draw: %s", exc)
            return self._draw(routes)
        self._last_weights = weights
        self._last_key = self._solutions.last_key
        self._last_live = (
            None if None not in costs else tuple(i for i, c in enumerate(costs) if c is not None)
        )
        explore = self._explore(rows)
        pick = self._last_pick = self._sample(weights) if explore is None else explore
        return routes[pick]

    def _explore(self, rows: Sequence[Row]) -> int | None:
        """In-band exploration: with ``explore_unprofiled_share`` probability, one admissible
        route never measured (priced at the unprofiled default, which the LP would avoid
        forever) serves this real request, so every route gets profiled without a paid
        probe; its index, or None."""
        share = self.params.explore_unprofiled_share
        if share <= 0:
            return None
        unknown = [i for i, r in enumerate(rows) if not r[4] and r[2] is not None]
        if not unknown or self._explore_rng.random() >= share:
            return None
        self.explored += 1
        return unknown[int(self._explore_rng.random() * len(unknown))]

    @property
    def last(self) -> tuple[Candidate, ...]:
        """The candidates of the last ``select``, with their LP weights."""
        return tuple(weighted([Candidate(*r) for r in self._last_rows], self._last_weights))

    def fallback_order(
        self, routes: Sequence[RouteView], request: RouteRequest, *, after_select: bool = False
    ) -> list[RouteView]:
        """``routes`` (the plan's rest) in the order the LP would choose them, each one the
        heaviest of the LP re-solved without those placed before it (the first
        RESOLVED_FALLBACKS; the rest by latency, then cost); masked routes last in
        declaration order. ``after_select``: ``routes`` are the last ``select``'s for
        ``request`` without the one it chose, in their order."""
        if len(routes) <= 1:
            return list(routes)
        if request is not self._last_request:
            return self._ordered(routes, self._rows(routes, request, self._clock()))
        if not after_select or self._last_key is None:
            at = {r[0]: r for r in self._last_rows}  # the plan's own select priced these
            rows = [at.get(r.endpoint) or self._one(r, request) for r in routes]
            return self._ordered(routes, rows)
        # The rest's inputs are the select's without its pick, so the select's LP key, which
        # rows were in it and the pick fix the rest's keys (each input is cut on its own), and
        # with the number of rows (the masked ones go last) the whole order: the memo's name.
        pick, rows = self._last_pick, self._last_rows
        name = ("after", self._last_key, pick, self._last_live, len(rows))
        made = self._solutions.recall(name, lambda: self._rest_latencies(rows, pick))
        if made is not None:
            return [routes[i] for i in made]
        return self._ordered(routes, [*rows[:pick], *rows[pick + 1 :]], name)

    @staticmethod
    def _rest_latencies(rows: Sequence[Row], pick: int) -> list[float]:
        """The LP's latencies of ``rows`` without ``pick``, in the LP's positions."""
        return [r[3] for i, r in enumerate(rows) if i != pick and r[2] is not None]

    def _ordered(
        self, routes: Sequence[RouteView], rows: Sequence[Row], name: Hashable = None
    ) -> list[RouteView]:
        """``routes`` (priced as ``rows``) in fallback order (see :meth:`fallback_order`),
        memoised under ``name`` (else one made of the LP key of ``rows``)."""
        given = [r[2] for r in rows]
        if None in given:
            live = [i for i, c in enumerate(given) if c is not None]
            if not live:
                return list(routes)
            given = [given[i] for i in live]
            latencies = [rows[i][3] for i in live]
        else:  # every route in the LP (the common case)
            live = list(range(len(rows)))
            latencies = [r[3] for r in rows]
        costs = [c or 0.0 for c in given]
        key = self._solutions.key(costs, latencies)
        if name is None:
            # The whole order follows from the rest's LP (its key) and where its routes sit
            # among ``routes``; keyed so, it holds while the rest's inputs do, whatever the
            # primary's did (the select's LP moves with every answer of the primary).
            name = (key, None if len(live) == len(rows) else tuple(live), len(rows))
            made = self._solutions.recall(name, lambda: latencies)
            if made is not None:
                return [routes[i] for i in made]
        order = [live[k] for k in self._solutions.order(costs, latencies, name, key)]
        rest = [i for i in live if i not in order]
        if len(rest) > 1:
            rest.sort(key=lambda i: (rows[i][3], rows[i][2] or 0.0))
        else:  # no exact latency orders the rest: the name fixes it all
            self._solutions.keep(
                name, (*order, *rest, *(i for i in range(len(routes)) if i not in live))
            )
        order += rest
        if len(order) < len(routes):
            taken = set(order)
            order += [i for i in range(len(routes)) if i not in taken]
        return [routes[i] for i in order]

    def _draw(self, routes: Sequence[RouteView]) -> RouteView:
        total = sum(r.weight for r in routes)
        x = self._rng.random() * total
        for r in routes:
            x -= r.weight
            if x < 0:
                return r
        return routes[-1]

    def explain(self, routes: Sequence[RouteView], request: RouteRequest) -> list[Candidate]:
        """Every candidate with its effective cost, latency estimate and LP weight, without
        sampling (what explain and /health/deep show)."""
        now = self._clock()
        cands = [
            Candidate(*r, samples=self.latency.samples(r[0], now))
            for r in self._rows(routes, request, now)
        ]
        try:
            return weighted(cands, self.solve(cands))
        except NoProviderError:
            return cands


def _reasons(rows: Sequence[Row]) -> str:
    return ", ".join(f"{r[0]}: {r[8]}" for r in rows)


def _first_token_ms(ttft_ms: float | None, latency_ms: float | None) -> float | None:
    """When the client saw the first token: a stream's TTFT; a whole answer arrives at once,
    so for it the attempt's latency is its time to first token."""
    if ttft_ms is not None:
        return float(ttft_ms)
    return None if not latency_ms else float(latency_ms)
