"""HealthActor: a read model of every endpoint's state, for ``/health/deep``."""

from __future__ import annotations

from actors.base import Actor, ActorContext, Serve
from bus import Envelope, NoRespondersError, RequestTimeoutError
from schemas import EndpointState, HealthReport, HealthRequest, StateRequest, subjects


def keep_newest(states: dict[str, EndpointState], st: EndpointState) -> None:
    """Fold ``st`` into ``states`` unless an older copy arrived late (by ``seq``)."""
    old = states.get(st.endpoint)
    if old is None or st.seq >= old.seq:
        states[st.endpoint] = st


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
                keep_newest(self._states, st)
            case HealthRequest():
                order = [e for e in self._endpoints if e in self._states]
                await env.respond(HealthReport(endpoints=tuple(self._states[e] for e in order)))
