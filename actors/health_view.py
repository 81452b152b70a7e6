"""HealthActor: a read model of every endpoint's state, for ``/health/deep``."""

from __future__ import annotations

from actors.base import Actor, ActorContext, Serve
from bus import Envelope, NoRespondersError, RequestTimeoutError
from schemas import EndpointState, HealthReport, HealthRequest, StateRequest, subjects


class HealthActor(Actor):
    """Holds the last EndpointState of every endpoint; answers HealthRequest."""

    def __init__(self, endpoints: tuple[str, ...]) -> None:
        self.name = "health"
        self.serves = (Serve(subjects.HEALTH_DEEP), Serve(subjects.ENDPOINT_STATE_ANY))
        self._endpoints = endpoints

    async def on_start(self, ctx: ActorContext) -> None:
        """Seed the view from each endpoint's owner."""
        self.ctx = ctx
        self._states: dict[str, EndpointState] = {}
        for e in self._endpoints:
            try:
                reply = await ctx.bus.request(
                    subjects.endpoint_get(e), StateRequest(), reply_type=EndpointState, timeout=1.0
                )
            except (NoRespondersError, RequestTimeoutError):
                continue
            if isinstance(reply, EndpointState):
                self._states[e] = reply

    async def handle(self, env: Envelope) -> None:
        """Fold state events; answer health requests in configured order."""
        match env.message:
            case EndpointState() as st:
                old = self._states.get(st.endpoint)
                if old is None or st.seq >= old.seq:
                    self._states[st.endpoint] = st
            case HealthRequest():
                order = [e for e in self._endpoints if e in self._states]
                await env.respond(HealthReport(endpoints=tuple(self._states[e] for e in order)))
