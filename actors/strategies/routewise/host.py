"""What the hosting ModelActor does for a RouteWise strategy besides asking it to choose
(``RouteWiseHost``):

- ``bootstrap``: at startup, replay the request log's recent attempt rows (its own and its
  donor models') into the evidence, with the rows' own timestamps. The log belongs to the
  StoreActor, so the rows are asked for over the bus (admin area ``log``, verb ``query``);
  no file is opened here. A store that does not answer leaves the evidence empty.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from actors.base import ActorContext, Serve
from actors.strategies.base import ProbeTick
from actors.strategies.routewise import settings as rw_settings
from bus import Bus, NoRespondersError, RequestTimeoutError
from schemas import (
    AdminCommand,
    AdminReply,
    InvalidRequestError,
    LatencyProbeDue,
    LatencySample,
    RouteCandidate,
    RouteRequest,
    RouteWiseCandidate,
    RouteWiseSettings,
    RouteWiseSettingsGet,
    subjects,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from actors.strategies.base import RouteView
    from actors.strategies.routewise.strategy import RouteWiseStrategy
    from schemas.config import ModelConfig

logger = logging.getLogger(__name__)

_QUERY_TIMEOUT = 5.0
_QUERY_ROW_CAP = 10_000  # what one log query returns at most


async def bootstrap(strategy: RouteWiseStrategy, bus: Bus, model: ModelConfig, now: float) -> int:
    """Replay recent request-log attempts of ``model`` (and its donors) into ``strategy``.
    Returns the rows used; 0 when disabled or the store does not answer."""
    params = strategy.params
    if not params.db_bootstrap_enabled or params.db_bootstrap_max_rows == 0:
        return 0
    since = now - max(
        params.latency_history_prior_window_sec, params.envelope_window_hours * 3600.0
    )
    limit = min(params.db_bootstrap_max_rows, _QUERY_ROW_CAP)
    used = 0
    sources = [
        (model.id, True),
        *((d, False) for d in params.envelope_bootstrap_donor_models or ()),
    ]
    for model_id, own in sources:
        cmd = AdminCommand(
            args={"kind": "attempt", "model": model_id, "since": since, "limit": limit},
            by="routewise-bootstrap",
        )
        try:
            reply = await bus.request(
                subjects.admin("log", "query"), cmd, reply_type=AdminReply, timeout=_QUERY_TIMEOUT
            )
        except (NoRespondersError, RequestTimeoutError):
            logger.info("routewise %s: no request log to bootstrap from", model.id)
            return used
        if isinstance(reply, AdminReply):
            used += strategy.bootstrap(reply.result.get("rows", ()), own=own)
    if used:
        logger.info("routewise %s: bootstrapped from %d request-log rows", model.id, used)
    return used


class RouteWiseHost:
    """The ModelActor's side of a RouteWise model: its extra subjects, its start (settings,
    bootstrap, the probe timer), the events that feed the strategy's views, the probe rounds
    and the candidate rows of status and explain. Owns no state beyond the strategy's."""

    def __init__(
        self, strategy: RouteWiseStrategy, model: ModelConfig, clock: Callable[[], float]
    ) -> None:
        self.strategy = strategy
        self._model = model
        self._clock = clock

    @property
    def prompt_tokens(self) -> int:
        """The last request's prompt size (status prices its rows for it)."""
        return self.strategy.last_prompt_tokens

    @staticmethod
    def serves(model: ModelConfig) -> tuple[Serve, ...]:
        """The settings hand-over and the prober's samples (the capacity pools' states feed
        the ModelActor's ``CapacityViews``, which the strategy reads)."""
        return (Serve(subjects.model_routewise(model.id)), Serve(subjects.model_latency(model.id)))

    async def start(self, ctx: ActorContext) -> None:
        """Take the admin's settings, replay the request log, arm the probe timer."""
        try:
            settings = await ctx.bus.request(
                subjects.ROUTEWISE_SETTINGS_GET,
                RouteWiseSettingsGet(),
                reply_type=RouteWiseSettings,
                timeout=1.0,
            )
        except (NoRespondersError, RequestTimeoutError):
            settings = None  # no owner (bare tests): router_params alone
        if isinstance(settings, RouteWiseSettings):
            self.apply(settings)
        await bootstrap(self.strategy, ctx.bus, self._model, self._clock())
        ctx.call_later(self.strategy.params.routewise_probe_interval_sec, ProbeTick())

    def apply(self, settings: RouteWiseSettings) -> None:
        """Retune the strategy to the settings' effective params for this model."""
        try:
            self.strategy.retune(rw_settings.effective(self._model, settings))
        except InvalidRequestError as exc:  # the owner validated it; a config reload may not
            logger.warning("RouteWise settings for %s not applied: %s", self._model.id, exc)

    def feed(self, msg: object) -> bool:
        """Apply a view event (LatencySample, RouteWiseSettings); False for any other
        message."""
        match msg:
            case LatencySample():
                self.strategy.sample(msg.endpoint, msg.ok, msg.ttft_ms, msg.ts or self._clock())
            case RouteWiseSettings():
                self.apply(msg)
            case _:
                return False
        return True

    async def probe_round(self, ctx: ActorContext, live: Mapping[str, RouteCandidate]) -> None:
        """Ask the prober for the routes of ``live`` (closed, not benched) the strategy
        wants measured, then re-arm the timer."""
        params = self.strategy.params
        for endpoint in self.strategy.probe_due(list(live), self._clock()):
            await ctx.publish(
                subjects.ROUTEWISE_PROBE_DUE,
                LatencyProbeDue(
                    endpoint=endpoint,
                    model=self._model.id,
                    candidate=live[endpoint],
                    timeout=params.routewise_probe_timeout_sec,
                ),
            )
        ctx.call_later(params.routewise_probe_interval_sec, ProbeTick())

    def rows(self, views: Sequence[RouteView], req: RouteRequest) -> tuple[RouteWiseCandidate, ...]:
        """Each route's effective cost, latency estimate and LP weight for ``req``."""
        return tuple(RouteWiseCandidate(**c.as_dict()) for c in self.strategy.explain(views, req))
