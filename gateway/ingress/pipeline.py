"""The inference pipeline: one request from its body to its answer, a step per line.

For chat completions, Responses and Messages (one ``Surface`` each) and embeddings:

1. read the body and decode it in the client's shape (``Surface.to_canonical``);
2. who asks (``RequestInfo``: affinity key, role, prompt estimate);
3. the target (``Targeting.walk``: a model or chain that does not exist is refused here,
   before the limits are asked, so it never counts against them), then the caller's limits
   (a ``Ticket``, asked now and answered while the first model's plan is asked), the plan,
   then the limits' verdict;
4. the failover loop (``Dispatcher``) under a watch for the client going away, and the
   answer (whole, streamed as SSE, or the embeddings) in the client's shape.

``InferenceCall`` is what one request carries between those steps once it is routed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from gateway.auth.gate import caller_of
from gateway.formats import anthropic_messages, openai_embeddings
from gateway.formats.openai_chat import prompt_estimate
from gateway.http.component import Component
from gateway.http.errors import error_code
from gateway.ingress.accounting import RequestRecord
from gateway.ingress.dispatch import Dispatcher
from gateway.ingress.failover import unexpected
from gateway.ingress.plan_walk import FallbackTargets, Targeting, Targets
from gateway.ingress.relay import relay
from gateway.ingress.request_info import RequestInfo
from gateway.ingress.surfaces import CHAT, MESSAGES, RESPONSES, Surface
from gateway.steering.labels import affinity_key, client_metadata
from schemas import ClientClosedError, GatewayError, InvalidRequestError
from schemas.canonical_markers import RATE_REPORT

if TYPE_CHECKING:
    import random
    from collections.abc import Awaitable, Callable, Mapping

    from bus import Bus
    from gateway.adapters.base import JSON, Adapter, UpstreamTarget
    from gateway.auth.gate import Caller
    from gateway.auth.provider_secrets import ProviderSecrets
    from gateway.http.request import HttpRequest
    from gateway.ingress.admission import Admission
    from gateway.ingress.admission_ticket import Ticket
    from gateway.ingress.clock import IngressClock
    from gateway.ingress.plan_walk import PlanWalk
    from gateway.ingress.request_info import Served
    from gateway.ingress.settling import LeaseKeeper
    from gateway.steering.rules import RulesView
    from gateway.steering.view import SteeringView
    from schemas import RoutePlan
    from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def _too_deep() -> InvalidRequestError:
    return InvalidRequestError("the request body is JSON nested too deeply")


@dataclass(slots=True)
class InferenceCall:
    """One routed inference request: the exchange, the client's surface (chat's for
    embeddings), its body as sent (``raw``) and canonical (``body``), the model field
    (``requested``), who asks (``info``), its plan walk and the first plan."""

    req: HttpRequest
    surface: Surface
    raw: JSON
    body: JSON
    requested: str
    info: RequestInfo
    walk: PlanWalk
    plan: RoutePlan


class Inference(Component):
    """Serves the inference routes. Owns the failover loop of the config it serves (a new
    one per reload: requests in flight keep theirs) and the target resolution. Handlers
    raise GatewayError subclasses, which the app answers in the client's shape."""

    def __init__(
        self,
        bus: Bus,
        config: GatewayConfig,
        *,
        adapters: Mapping[str, Adapter],
        secrets: ProviderSecrets,
        leases: LeaseKeeper,
        admission: Admission,
        steering: SteeringView,
        rules: RulesView,
        clock: IngressClock,
        rng: random.Random | None = None,
    ) -> None:
        self._bus = bus
        self._config = config
        self._adapters = adapters
        self._secrets = secrets
        self._leases = leases
        self._admission = admission
        self._clock = clock
        self.targeting = Targeting(
            bus,
            config,
            secrets=secrets,
            steering=steering,
            rules=rules,
            lease_holder=leases.holder,
            clock=clock.steady,
            rng=rng,
        )
        self._dispatcher = self._dispatcher_for(config, Targets(config, secrets))

    def _dispatcher_for(self, config: GatewayConfig, targets: Targets) -> Dispatcher:
        return Dispatcher(
            self._bus,
            self._adapters,
            targets,
            config.routing.failover,
            self._leases,
            clock=self._clock.steady,
            wall=self._clock.wall,
        )

    def reconfigure(self, config: GatewayConfig) -> None:
        """Serve ``config`` from the next request on. Requests in flight keep the model and
        plan they started with; their targets still resolve (the old config's, as a
        fallback)."""
        targets = FallbackTargets(config, Targets(self._config, self._secrets), self._secrets)
        self._dispatcher = self._dispatcher_for(config, targets)
        self._config = config
        self.targeting.reconfigure(config)

    # -- the routes ---------------------------------------------------------------------

    async def chat(self, req: HttpRequest, record: RequestRecord) -> None:
        """``POST /v1/chat/completions``."""
        await self._inference(req, CHAT, record)

    async def responses(self, req: HttpRequest, record: RequestRecord) -> None:
        """``POST /v1/responses``."""
        await self._inference(req, RESPONSES, record)

    async def messages(self, req: HttpRequest, record: RequestRecord) -> None:
        """``POST /v1/messages``."""
        await self._inference(req, MESSAGES, record)

    async def embeddings(self, req: HttpRequest, record: RequestRecord) -> None:
        """``POST /v1/embeddings``."""
        raw, _ = await self._read_json(req)
        body = openai_embeddings.validate_embeddings_request(raw)
        requested = body["model"]
        client_metadata(req)
        caller = caller_of(req)
        # The prompt estimate also prices (and is shown as the usage of) an answer that
        # reports no usage.
        estimate = openai_embeddings.embeddings_estimate(body)
        info = self._info(req, "embeddings", False, estimate, record, caller)
        ticket: Ticket | None = None
        try:
            walk = await self._walk(req, body, requested, info)
            ticket = self._begin(req, caller, info, requested, None, info.prompt_estimate)
            routed = self._routed(req, CHAT, body, body, requested, info, walk, ticket)
            await self._until_disconnect(req, walk, routed, self._serve_embeddings)
        finally:
            if ticket is not None:
                await ticket.finish()

    async def count_tokens(self, req: HttpRequest) -> None:
        """``POST /v1/messages/count_tokens``: the gateway's own prompt estimate (the one
        its context-window check uses), not the model's tokenizer. Raises
        InvalidRequestError, RouteNotFoundError."""
        raw, data = await self._read_json(req)
        body = anthropic_messages.to_chat_request(raw, counting=True)
        self.targeting.resolve(str(body["model"]), req)
        await req.respond(200, _encode({"input_tokens": prompt_estimate(data, raw)}))

    def request_info(self, req: HttpRequest, surface: str, stream: bool) -> RequestInfo:
        """A new request's identity (explain uses the live path's)."""
        return self._info(req, surface, stream)

    # -- the steps ----------------------------------------------------------------------

    async def _inference(self, req: HttpRequest, surface: Surface, record: RequestRecord) -> None:
        raw, data = await self._read_json(req)
        body = surface.to_canonical(raw)
        if surface is MESSAGES and (beta := req.header("anthropic-beta")):
            body[anthropic_messages.ANTHROPIC_BETA] = beta  # for an anthropic route
        client_metadata(req)  # refused early, whatever the model
        requested = str(body["model"])
        stream = bool(body.get("stream"))
        caller = caller_of(req)
        info = self._info(req, surface.name, stream, prompt_estimate(data, raw), record, caller)
        ticket: Ticket | None = None
        try:
            walk = await self._walk(req, body, requested, info)
            ticket = self._begin(req, caller, info, requested, body, info.prompt_estimate)
            routed = self._routed(req, surface, raw, body, requested, info, walk, ticket)
            serve = self._serve_stream if stream else self._serve_once
            await self._until_disconnect(req, walk, routed, serve)
        except GatewayError as err:
            surface.client_terms(raw, err)  # a refusal after translation, in the client's terms
            raise
        finally:
            if ticket is not None:
                await ticket.finish()

    async def _read_json(self, req: HttpRequest) -> tuple[Any, bytes]:
        """The body decoded, and as sent. Raises InvalidRequestError, RequestTooLargeError."""
        raw = await req.body(self._config.server.max_body_bytes)
        try:
            return _decode(raw), raw
        except msgspec.DecodeError:
            raise InvalidRequestError("the request body is not valid JSON") from None
        except RecursionError:  # nested past the stack: costs nothing until it happens
            raise _too_deep() from None

    def _info(
        self,
        req: HttpRequest,
        surface: str,
        stream: bool,
        prompt_estimate: int = 0,
        record: RequestRecord | None = None,
        caller: Caller | None = None,
    ) -> RequestInfo:
        if caller is None:
            caller = caller_of(req)
        return RequestInfo(
            request_id=req.request_id,
            surface=surface,
            stream=stream,
            caller=affinity_key(
                req,
                key_hash=caller.key_hash,
                trust_proxy_headers=self._config.routing.trust_proxy_headers,
            ),
            prompt_estimate=prompt_estimate,
            started=self._clock.steady(),
            role=caller.role,
            record=record if record is not None else RequestRecord(),
        )

    def _begin(
        self,
        req: HttpRequest,
        caller: Caller,
        info: RequestInfo,
        requested: str,
        body: JSON | None,
        prompt_tokens: int,
    ) -> Ticket | None:
        """Ask the limits' owner now (answered while the routing request runs); None when
        the caller has no limits."""
        if caller.key_hash is None:
            return None  # no limit attaches to an anonymous caller (admission.caller_subjects)
        ticket = self._admission.begin(
            req,
            caller,
            info.request_id,
            self.targeting.models.get(requested),
            body,
            prompt_tokens,
        )
        if ticket is not None:
            info.on_attempt = ticket.attempted
            if info.record.trace is not None:
                info.record.trace.admission_started()
        return ticket

    async def _walk(
        self, req: HttpRequest, body: JSON, requested: str, info: RequestInfo
    ) -> PlanWalk:
        """The models that may serve ``requested``, resolved before the limits are asked: a
        model or chain that does not exist is refused without counting against them.
        Raises RouteNotFoundError, InvalidRequestError."""
        ask = functools.partial(
            self.targeting.plan_for, body=body, surface=info.surface, req=req, info=info
        )
        return await self.targeting.walk(requested, req, info, ask, body=body)

    async def _routed(
        self,
        req: HttpRequest,
        surface: Surface,
        raw: JSON,
        body: JSON,
        requested: str,
        info: RequestInfo,
        walk: PlanWalk,
        ticket: Ticket | None,
    ) -> InferenceCall:
        """The request with its first plan, admitted by its limits. Raises what planning
        raises, and RateLimitedError, BudgetExceededError, LimitsUnavailableError (a refusal,
        or a cancellation while the verdict is awaited, gives the plan's leases back)."""
        walk.budget_for = functools.partial(self._dispatcher.budget, info)  # cooling waits
        plan = await walk.first()
        if ticket is not None:
            trace = info.record.trace
            try:
                await ticket.decide()
            except GatewayError as err:
                if trace is not None:
                    trace.admitted(error_code(err))
                await self._dispatcher.release_plan(info, plan)
                raise
            except BaseException:  # cancelled while the verdict is awaited: leases back too
                with _scope_class()(shield=True):
                    await self._dispatcher.release_plan(info, plan)
                raise
            if trace is not None:
                trace.admitted()
        return InferenceCall(req, surface, raw, body, requested, info, walk, plan)

    async def _until_disconnect(
        self,
        req: HttpRequest,
        walk: PlanWalk,
        routed: Awaitable[InferenceCall],
        serve: Callable[[InferenceCall], Awaitable[None]],
    ) -> None:
        """Route, then ``serve``, but cancel both when the client goes away (not counted as
        a failure; heard during ``walk``'s waits for a cooling route too). Raises
        ClientClosedError when it went before its answer began (during such a wait the
        request was sent once it ended, and its row said 200 with the 429 before it)."""
        with _scope_class()() as scope:
            watch = _DisconnectWatch(req, scope)
            walk.on_wait = watch.listen
            try:
                call = await routed
                watch.serving()
                await serve(call)
            except RecursionError:
                # A body nested just short of what decoding refuses still cannot be encoded
                # again deeper in the stack (for the upstream): the same refusal.
                raise _too_deep() from None
            finally:
                watch.cancel()
        if scope.cancelled_caught and not req.started:
            raise ClientClosedError("the client went away before its answer began")

    def _headers(self, call: InferenceCall, endpoint: str) -> list[tuple[bytes, bytes]]:
        return [
            (b"x-routed-via", endpoint.encode()),
            call.info.record.overhead_header(),
        ]

    async def _serve_once(self, call: InferenceCall) -> None:
        # Each answer's rendering, by the answer: both sides of a hedge race may render one.
        rendered: dict[int, bytes] = {}
        body, surface, raw, steered = call.body, call.surface, call.raw, call.walk.steered

        async def complete(adapter: Adapter, target: UpstreamTarget, model: str) -> JSON:
            answer = await adapter.complete(target, body)
            # Rendered within the attempt (what the client's shape cannot express is this
            # route's bad response); the limit it reported is the attempt's, not the client's.
            shown = call.requested if steered is None else model
            rate = answer.pop(RATE_REPORT, None)
            rendered[id(answer)] = surface.render(answer, shown, raw)
            if rate is not None:
                answer[RATE_REPORT] = rate
            return answer

        async def write(served: Served) -> None:
            if steered is not None:  # the answer shows ``shown`` already; the caller stays on it
                self.targeting.served(call.walk, served.model, call.requested)
            answer = rendered[id(served.body)]
            await call.req.respond(200, answer, self._headers(call, served.candidate.endpoint))

        await self._dispatcher.call(call.info, call.plan, complete, call.walk, write)

    async def _serve_embeddings(self, call: InferenceCall) -> None:
        body = call.body

        async def embed(adapter: Adapter, target: UpstreamTarget, model: str) -> JSON:
            return await adapter.embed(target, body)

        async def write(served: Served) -> None:
            served.body["model"] = self.targeting.served(call.walk, served.model, call.requested)
            answer = openai_embeddings.shown_usage(served.body, call.info.prompt_estimate)
            await call.req.respond(
                200, _encode(answer), self._headers(call, served.candidate.endpoint)
            )

        await self._dispatcher.call(call.info, call.plan, embed, call.walk, write)

    async def _serve_stream(self, call: InferenceCall) -> None:
        stream = await self._dispatcher.open_stream(call.info, call.plan, call.body, call.walk)
        try:
            shown = self.targeting.served(call.walk, stream.model, call.requested)
            renderer = call.surface.stream(shown, call.raw)
        except Exception as exc:  # a gateway bug before the relay: the attempt ends all the same
            await stream.close(*unexpected(stream.candidate.endpoint, exc))
            raise
        try:
            head = [*_SSE_HEADERS, *self._headers(call, stream.candidate.endpoint)]
            await relay(call.req, head, renderer, stream)
        finally:  # however the relay ends, its capacity lease goes back (a no-op once closed)
            await self._leases.release(stream.candidate)


WATCH_AFTER = 0.01
"""Seconds a request is served before its disconnect watch starts."""


@functools.cache
def _scope_class() -> type[anyio.CancelScope]:
    """The running backend's cancel scope class: ``anyio.CancelScope()`` looks the backend up
    on every call (about 3 µs a request); the gateway runs on asyncio only."""
    return type(anyio.CancelScope())


class _DisconnectWatch:
    """Cancels ``scope`` once the client's ASGI receive says ``http.disconnect``: a task on
    the receive itself (no coroutine of its own), armed again on any other message. It
    starts once the request has been served for :data:`WATCH_AFTER` (:meth:`serving`), or at
    once when its routing waits for a cooling route (:meth:`listen`), so an answer ready
    sooner never pays for it (listening costs a request at concurrency 64 about 15 µs):
    under granian each receive is a round trip between the server's threads and this loop,
    and the watch takes two (its first answer is the empty ``http.request`` that ends the
    body). A client gone in that time is heard as the watch starts. Owns that task and the
    timer that starts it; ``cancel`` ends both."""

    __slots__ = ("_receive", "_scope", "_start", "_task")

    def __init__(self, req: HttpRequest, scope: anyio.CancelScope) -> None:
        self._receive = req.receive
        self._scope = scope
        self._task: asyncio.Future[Any] | None = None
        self._start: asyncio.TimerHandle | None = None

    def listen(self) -> None:
        """Listen now, unless already (a long wait begins)."""
        if self._task is None:
            self._begin()

    def serving(self) -> None:
        """The request is routed: listen :data:`WATCH_AFTER` from now, unless already."""
        if self._task is None:
            self._start = asyncio.get_running_loop().call_later(WATCH_AFTER, self._begin)

    def _begin(self) -> None:
        if self._task is None:
            self._task = self._arm()

    def _arm(self) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(self._receive())
        task.add_done_callback(self._heard)
        return task

    def _heard(self, task: asyncio.Future[Any]) -> None:
        if task.cancelled() or task.exception() is not None:
            return  # ended with its request, or the server's receive broke: nothing to watch
        if task.result()["type"] == "http.disconnect":
            self._scope.cancel()
        else:
            self._task = self._arm()

    def cancel(self) -> None:
        if self._start is not None:
            self._start.cancel()
        if self._task is not None:
            self._task.cancel()
