"""The ingress's view of the routing rule set, and the one call target resolution makes.

The RulesActor owns the set; this view holds it compiled: filled by a get when the ingress
starts and replaced by every ``RulesState`` the owner publishes on ``llmgw.rules.state``
(one publisher, so events arrive in order; a get answered after an event is stale and
dropped). Evaluating it costs no bus round trip.

Target resolution of ``model: "auto"`` calls :meth:`RulesView.route_for` with the request's
params (:func:`request_params`, derived from what the ingress already decoded), the client's
labels (``gateway.steering.labels``) and a predicate saying which routes the caller's organisation
may use; ``None`` means no rule applies and the active chain serves.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from gateway.auth.gate import follow, unfollow
from gateway.formats.openai_chat import input_modalities
from gateway.http.component import Component
from gateway.steering.labels import client_metadata
from schemas import GatewayError, InvalidRequestError, RulesGet, RulesState, subjects
from schemas.catalog import AUTO, ascii_lower
from schemas.rule_language import RuleSetError
from schemas.rule_language import compile_rules as _compile
from schemas.rule_match import CompiledRule, CompiledRules, RuleTrace

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from bus import Bus
    from gateway.http.request import HttpRequest
    from gateway.steering.resolver import SteeringBook

logger = logging.getLogger(__name__)

_GET_TIMEOUT_S = 2.0
JSON = dict[str, Any]


def request_params(surface: str, body: JSON, prompt_tokens: int, role: str) -> JSON:
    """The ``params.*`` of one request: ``body`` is the canonical (chat-shaped) body, or the
    embeddings body; ``prompt_tokens`` the estimate the context-window check uses. Fields
    the request does not set (``max_tokens``, ``temperature``) are absent."""
    messages = body.get("messages")
    modalities = input_modalities(body) if messages else ()
    params: JSON = {
        "surface": surface,
        "stream": body.get("stream") is True,
        "prompt_tokens": prompt_tokens,
        "has_tools": bool(body.get("tools")),
        "has_images": "image" in modalities,
        "modalities": ("text", *modalities),
        "message_count": len(messages) if isinstance(messages, list) else 0,
        "role": role,
    }
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if type(max_tokens) is int:
        params["max_tokens"] = max_tokens
    temperature = body.get("temperature")
    if type(temperature) in (int, float):
        params["temperature"] = temperature
    return params


def _usable_by_all(route: str) -> bool:
    return True


def usable_in(book: SteeringBook, org: str) -> Callable[[str], bool]:
    """Whether a rule's route resolves for a caller of ``org`` in ``book``: an axis with a
    model, or a chain of the deployment or of ``org`` with an enabled model. Anything else
    (another organisation's chain, an unknown or empty one) resolves to nothing."""

    def usable(route: str) -> bool:
        try:
            book.ordering(route, org)
        except InvalidRequestError:
            return False
        return True

    return usable


class RequestFacts(Protocol):
    """What a rule may test of a request beside its body (the ingress's ``RequestInfo``)."""

    @property
    def surface(self) -> str: ...
    @property
    def prompt_estimate(self) -> int: ...
    @property
    def role(self) -> str | None: ...


class RulesView(Component):
    """Holds the compiled rule set of this ingress; owns the subscription that keeps it."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self.state: RulesState | None = None  # None until the owner answered or published
        self.compiled = CompiledRules()
        self._task: asyncio.Task[None] | None = None
        self._resyncing: asyncio.Task[None] | None = None
        self._events = 0

    async def start(self) -> None:
        """Follow the owner's events, then ask it for the current set (when it does not
        answer, the first event fills the view; until then no rule applies)."""
        self._task = await follow(
            self._bus, subjects.RULES_STATE, self._on_event, name="routing-rules"
        )
        self._resyncing = asyncio.create_task(self._resync(), name="routing-rules-back")
        await self._ask()

    async def _ask(self) -> bool:
        seen = self._events
        try:
            reply = await self._bus.request(
                subjects.RULES_GET, RulesGet(), reply_type=RulesState, timeout=_GET_TIMEOUT_S
            )
        except GatewayError as exc:
            logger.info("routing rules not known yet (%s); waiting for the owner", exc.message)
            return False
        if isinstance(reply, RulesState) and self._events == seen:
            self.apply(reply)
        return True

    async def _resync(self) -> None:
        # The events sent while the bus's connection was down never arrive: ask again once
        # it is back (until the owner answers, or an event says it all first).
        while True:
            await self._bus.reconnected()
            seen = self._events
            while not await self._ask() and self._events == seen:  # noqa: ASYNC110
                await asyncio.sleep(_GET_TIMEOUT_S)

    async def aclose(self) -> None:
        """Stop following the owner."""
        task, self._task = self._task, None
        await unfollow(task)
        resyncing, self._resyncing = self._resyncing, None
        await unfollow(resyncing)

    async def _on_event(self, msg: object) -> None:
        if isinstance(msg, RulesState):
            self._events += 1
            self.apply(msg)

    def apply(self, state: RulesState) -> None:
        """Hold ``state`` (compiled) from now on; a set that does not compile reads as
        disabled."""
        compiled = CompiledRules()
        if state.status == "ok":
            try:
                compiled = _compile(state.rules)
            except RuleSetError as exc:  # the owner validated it; never fail routing on it
                logger.error("routing rules not applied: %s", exc.message)
                state = RulesState(status="disabled", reason=exc.message, version=state.version)
        self.state, self.compiled = state, compiled

    def route_for(
        self,
        params: Mapping[str, Any],
        metadata: Mapping[str, Any],
        usable: Callable[[str], bool] = _usable_by_all,
    ) -> CompiledRule | None:
        """The first rule that matches and whose route (``auto:<chain>``/``auto:<axis>``,
        lower-case) ``usable`` accepts for the caller's organisation; None: no rule applies.
        Never raises."""
        rules = self.compiled
        return rules.first(params, metadata, usable) if rules.rules else None

    def applies(self, requested: str) -> bool:
        """Whether rules may route a request for ``requested``: only ``auto`` (any case), the
        request that named no target, and only while there are rules."""
        return bool(self.compiled.rules) and ascii_lower(requested) == AUTO

    def _inputs(self, body: JSON, req: HttpRequest, info: RequestFacts) -> tuple[JSON, Any]:
        role = info.role or ""
        return request_params(info.surface, body, info.prompt_estimate, role), client_metadata(req)

    def for_request(
        self, body: JSON, req: HttpRequest, info: RequestFacts, book: SteeringBook, org: str
    ) -> CompiledRule | None:
        """The rule routing this ``auto`` request (see :meth:`route_for`). Raises
        InvalidRequestError for a bad ``x-llmgw-metadata`` header."""
        params, metadata = self._inputs(body, req, info)
        return self.route_for(params, metadata, usable_in(book, org))

    def explain_request(
        self, body: JSON, req: HttpRequest, info: RequestFacts, book: SteeringBook, org: str
    ) -> list[JSON]:
        """Every rule with its outcome for this request, as explain shows them."""
        params, metadata = self._inputs(body, req, info)
        return [t.to_dict() for t in self.explain(params, metadata, usable_in(book, org))]

    def explain(
        self,
        params: Mapping[str, Any],
        metadata: Mapping[str, Any],
        usable: Callable[[str], bool] = _usable_by_all,
    ) -> list[RuleTrace]:
        """Every rule in order with its outcome (see ``CompiledRules.explain``)."""
        return self.compiled.explain(params, metadata, usable)

    def health(self) -> JSON:
        """The ``rules`` line of ``/health/deep``."""
        state = self.state
        if state is None:
            return {"status": "unknown", "rules": 0}
        line: JSON = {
            "status": state.status,
            "rules": len(self.compiled.rules),
            "version": state.version,
        }
        if state.reason:
            line["reason"] = state.reason
        return line
