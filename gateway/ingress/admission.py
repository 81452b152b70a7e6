"""Admission at the ingress: ask the limits' owner whether a request may start, beside routing.

:class:`Admission` holds this ingress's view of which subjects are limited (``LimitsState``
from the LimitsActor: a get at start, then its events), so a caller without any limit costs
nothing. For a limited caller :meth:`Admission.begin` sends ``AdmitRequest`` at once and
returns a ``Ticket`` (``gateway/ingress/admission_ticket.py``); the routing request runs
meanwhile, and ``Ticket.decide`` waits for the verdict (one bus round trip in parallel, not
in series). A refused request never reaches an upstream and is never an endpoint's failure.

Every admitted lease is renewed while its request runs (one ``LimitRenew`` per ingress every
third of ``limits.lease_ttl_seconds``, when the view is also re-read to mend a lost event)
and settled when it ends (``LimitSettle`` with the tokens and cost its attempts really used,
whatever way it ended: plain, streamed, cut or cancelled). Settles are requests the owner
acknowledges once saved (one batch per turn of the event loop, awaited by no request): one it
does not acknowledge in time (it is restarting, or was killed) is owed, kept (up to
:data:`OWED_MAX`, the oldest dropped and counted past that) and sent again every
:data:`OWED_RETRY_S` until acknowledged, so it is counted when the owner is back; the owner
ignores a request id it already settled, so a settle sent twice counts once. No answer to an
admission within ``limits.decision_timeout_seconds``: 503 with ``Retry-After`` (fail closed,
the default; the request settles the lease a late verdict may have taken) or, with
``limits.fail_open``, the request runs and its settle is owed the same way. A limit is never
counted in this process alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections import deque
from typing import TYPE_CHECKING

import anyio

from gateway.auth.gate import follow, unfollow
from gateway.formats.openai_chat import output_cap
from gateway.ingress.admission_ticket import Ticket
from schemas import (
    GatewayError,
    LimitsUnavailableError,
    raise_for_reply,
    subjects,
)
from schemas.limits import (
    AdmitBatch,
    AdmitBatchReply,
    AdmitReply,
    AdmitRequest,
    LimitRenew,
    LimitSettle,
    LimitSettleBatch,
    LimitsGet,
    LimitsState,
)
from schemas.pricing import cost_usd

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from bus import Bus
    from gateway.auth.gate import Caller
    from gateway.http.request import HttpRequest
    from schemas.config import GatewayConfig, ModelConfig
    from schemas.limits import LimitSpec
    from schemas.pricing import Pricing

logger = logging.getLogger(__name__)

_GET_TIMEOUT_S = 2.0
OWED_MAX = 10_000
"""Settles this ingress keeps for an owner that did not acknowledge them (the oldest are
dropped, and counted in the log, past this)."""
_OWED_BATCH = 256  # owed settles sent again in one message
OWED_RETRY_S = 1.0
"""How long owed settles the owner did not acknowledge wait before they are sent again."""


def caller_subjects(caller: Caller) -> tuple[str, ...]:
    """The subjects a caller's limits attach to (none for an anonymous or bootstrap caller)."""
    if caller.key_hash is None or not caller.key_id or caller.key_id == "bootstrap-admin":
        return ()
    out = [f"key:{caller.key_id}"]
    if caller.org:
        out.append(f"org:{caller.org}")
        if caller.user:
            out.append(f"user:{caller.org}/{caller.user}")
    return tuple(out)


def reservation(
    model: ModelConfig | None,
    body: dict[str, object] | None,
    prompt_tokens: int,
    default_max_tokens: int,
    steered: tuple[Pricing | None, ...] = (),
) -> tuple[int, float]:
    """(tokens, USD) to reserve: the prompt estimate plus ``max_tokens`` times ``n`` (or the
    default; none without a ``body``: embeddings complete nothing), priced at the dearest
    of the model's routes; for a model not known yet (a steered request's is chosen later,
    among any of the catalogue's) at the dearest of ``steered`` (:func:`dearest_prices`)."""
    completion = 0
    if body is not None:
        asked = output_cap(body)
        completion = asked if asked is not None else default_max_tokens
    prices = steered if model is None else tuple(r.pricing for r in model.route)
    cost = max(
        (cost_usd(p, prompt_tokens=prompt_tokens, completion_tokens=completion) for p in prices),
        default=0.0,
    )
    return prompt_tokens + completion, cost


def dearest_prices(config: GatewayConfig) -> tuple[Pricing, ...]:
    """The prices of the routes of ``config`` that no other route's prices exceed on both
    prompt and completion (any reservation's dearest route is among them: usually a few)."""
    prices = {r.pricing for m in config.models for r in m.route if r.pricing is not None}
    return tuple(
        p
        for p in prices
        if not any(
            (q.prompt, q.completion) != (p.prompt, p.completion)
            and q.prompt >= p.prompt
            and q.completion >= p.completion
            for q in prices
        )
    )


class Admission:
    """This ingress's side of limits (see the module docstring). Owns the limits view, the
    running leases and their renewal."""

    def __init__(self, bus: Bus, config: GatewayConfig) -> None:
        self._bus = bus
        self.settings = config.limits
        self._steered = dearest_prices(config)
        self._limits: dict[str, LimitSpec] = {}
        self._roles: frozenset[str] = frozenset()
        self._loaded = False
        self.running: dict[str, Ticket] = {}
        self.ingress = f"{socket.gethostname()}-{os.getpid()}-{id(self):x}"
        self._follow: asyncio.Task[None] | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._owed: deque[LimitSettle] = deque()
        self._paying: asyncio.Task[None] | None = None
        self.owed_dropped = 0
        # This turn's admissions and settles, sent as one message each when it ends.
        self._asking: list[tuple[AdmitRequest, asyncio.Future[AdmitReply]]] = []
        self._settling: list[LimitSettle] = []
        self._flush_due = False
        self._sending: set[asyncio.Task[None]] = set()

    def reconfigure(self, config: GatewayConfig) -> None:
        """Use ``config``'s ``limits:`` settings (and prices) from the next request on."""
        self.settings = config.limits
        self._steered = dearest_prices(config)

    async def start(self) -> None:
        """Follow the owner's limits and start renewing leases."""
        self._follow = await follow(
            self._bus, subjects.LIMITS_STATE, self._on_message, name="limits-view"
        )
        await self.refresh()
        self._renewer = asyncio.create_task(self._renew(), name="limits-renew")

    async def aclose(self) -> None:
        """Send what this turn queued, stop following and renewing."""
        self._flush()
        if self._sending:
            await asyncio.wait(self._sending, timeout=self.settings.decision_timeout_seconds)
            for sending in list(self._sending):  # counted by the owner already, or lost
                sending.cancel()
        await unfollow(self._follow)
        self._follow = None
        for task in (self._renewer, self._paying):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._renewer = self._paying = None

    async def refresh(self, timeout: float = _GET_TIMEOUT_S) -> None:
        """Load the limits from their owner (kept as they were when it does not answer)."""
        try:
            state = await self._bus.request(
                subjects.LIMITS_GET, LimitsGet(), reply_type=LimitsState, timeout=timeout
            )
        except GatewayError as exc:
            if not self._loaded:
                logger.warning(
                    "limits: could not load the limits (%s); asking the owner "
                    "for every keyed request until it answers",
                    exc.message,
                )
            return
        if isinstance(state, LimitsState):
            self._apply(state)

    async def _on_message(self, msg: object) -> None:
        if isinstance(msg, LimitsState):
            self._apply(msg)

    def _apply(self, state: LimitsState) -> None:
        self._limits = dict(state.limits)
        self._roles = frozenset(s[5:] for s in state.limits if s.startswith("role:"))
        self._loaded = True

    def limited(self, caller: Caller) -> tuple[str, ...]:
        """The caller's subjects when any may be limited, else () (no check needed). Until
        the view is loaded, every keyed caller may be."""
        found = caller_subjects(caller)
        if not found or not self._loaded or caller.role in self._roles:
            return found
        return found if any(s in self._limits for s in found) else ()

    def begin(
        self,
        req: HttpRequest,
        caller: Caller,
        request_id: str,
        model: ModelConfig | None,
        body: dict[str, object] | None,
        prompt_tokens: int,
    ) -> Ticket | None:
        """Send the admission request now (its answer is awaited by ``Ticket.decide``);
        None for a caller without limits."""
        found = self.limited(caller)
        if not found:
            return None
        tokens, cost = reservation(
            model, body, prompt_tokens, self.settings.default_max_tokens, self._steered
        )
        return Ticket(
            self,
            req,
            AdmitRequest(
                request_id=request_id,
                ingress=self.ingress,
                subjects=found,
                role=caller.role,
                tokens=tokens,
                cost_usd=cost,
            ),
        )

    def ask(self, request: AdmitRequest) -> asyncio.Future[AdmitReply]:
        """The owner's verdict on ``request``, set once this turn's batch is answered; its
        exception a GatewayError (no responders, timeout, a refusal of the batch)."""
        verdict: asyncio.Future[AdmitReply] = asyncio.get_running_loop().create_future()
        self._asking.append((request, verdict))
        self._flush_soon()
        return verdict

    def settle(self, done: LimitSettle) -> None:
        """Settle a lease with this turn's other settles (owed until acknowledged)."""
        self._settling.append(done)
        self._flush_soon()

    def _flush_soon(self) -> None:
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Send this turn's settles, then its admissions (a slot freed by the one is free
        for the other)."""
        self._flush_due = False
        settling, self._settling = self._settling, []
        asking, self._asking = self._asking, []
        if settling:
            self._send(self._send_settles(settling))
        if asking:
            self._send(self._send_admissions(asking))

    def _send(self, coro: Coroutine[None, None, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send_settles(self, settling: list[LimitSettle]) -> None:
        """Send this turn's settles as one request; owe them when not acknowledged."""
        if not await self._acknowledged(settling):
            for done in settling:
                self.owe(done)

    async def _acknowledged(self, settles: list[LimitSettle]) -> bool:
        """True once the owner acknowledged ``settles`` (counted now, or already before)."""
        msg = settles[0] if len(settles) == 1 else LimitSettleBatch(settles=tuple(settles))
        # The owner acknowledges once its next counters snapshot holds them.
        timeout = self.settings.decision_timeout_seconds + self.settings.snapshot_seconds
        try:
            raise_for_reply(
                await self._bus.request(
                    subjects.LIMITS_SETTLE, msg, reply_type=AdmitReply, timeout=timeout
                )
            )
        except GatewayError as exc:
            logger.info("limits: %d settles not acknowledged (%s)", len(settles), exc.message)
            return False
        return True

    async def _send_admissions(
        self, asking: list[tuple[AdmitRequest, asyncio.Future[AdmitReply]]]
    ) -> None:
        try:
            replies = await self._verdicts(tuple(request for request, _ in asking))
        except GatewayError as exc:
            for _, verdict in asking:
                if not verdict.done():
                    verdict.set_exception(exc)
            return
        for (request, verdict), reply in zip(asking, replies, strict=True):
            if not verdict.done():
                verdict.set_result(reply)
            elif reply.admitted:  # its request went away meanwhile: give the lease back
                self.settle(
                    LimitSettle(
                        request_id=request.request_id, subjects=request.subjects, role=request.role
                    )
                )

    async def _verdicts(self, requests: tuple[AdmitRequest, ...]) -> tuple[AdmitReply, ...]:
        """One verdict per request, in order. Raises GatewayError (no responders, timeout,
        a refusal, an answer that does not match the batch)."""
        timeout = self.settings.decision_timeout_seconds
        if len(requests) == 1:
            one = await self._bus.request(
                subjects.LIMITS_ADMIT, requests[0], reply_type=AdmitReply, timeout=timeout
            )
            return (raise_for_reply(one),)
        batch = raise_for_reply(
            await self._bus.request(
                subjects.LIMITS_ADMIT,
                AdmitBatch(requests=requests),
                reply_type=AdmitBatchReply,
                timeout=timeout,
            )
        )
        if len(batch.replies) != len(requests):
            raise LimitsUnavailableError(
                f"the limits' owner answered {len(batch.replies)} of {len(requests)} requests"
            )
        return batch.replies

    async def publish(self, subject: str, msg: LimitRenew) -> None:
        """Fire-and-forget; a lost renewal is sent again at the next tick."""
        try:
            await self._bus.publish(subject, msg)
        except GatewayError as exc:
            logger.warning("limits: %s not published: %s", type(msg).__name__, exc)

    def owe(self, done: LimitSettle) -> None:
        """Keep a settle (of a fail-open request, or one not acknowledged) until the owner
        acknowledges it."""
        self._keep(done)
        self._pay()

    def _keep(self, done: LimitSettle) -> None:
        if len(self._owed) >= OWED_MAX:
            self._owed.popleft()
            self.owed_dropped += 1
            if self.owed_dropped & (self.owed_dropped - 1) == 0:  # 1, 2, 4, ...
                logger.error(
                    "limits: %d requests could not be counted (the owner stayed unreachable "
                    "while %d settles waited for it)",
                    self.owed_dropped,
                    OWED_MAX,
                )
        self._owed.append(done)

    @property
    def owed(self) -> int:
        """Settles not yet acknowledged by the owner."""
        return len(self._owed)

    def _pay(self) -> None:
        if self._paying is None or self._paying.done():
            self._paying = asyncio.create_task(self._pay_owed(), name="limits-owed")

    async def _pay_owed(self) -> None:
        """Send owed settles, oldest first and in batches, until all are acknowledged (a
        batch that is not is kept and sent again after :data:`OWED_RETRY_S`)."""
        while self._owed:
            batch = [self._owed.popleft() for _ in range(min(_OWED_BATCH, len(self._owed)))]
            if not await self._acknowledged(batch):
                owed_since, self._owed = self._owed, deque(batch)
                for done in owed_since:  # owed while this batch was out: after it, bounded
                    self._keep(done)
                await asyncio.sleep(OWED_RETRY_S)

    async def _renew(self) -> None:
        while True:
            await anyio.sleep(self.settings.lease_ttl_seconds / 3)
            if self.running:
                await self.publish(
                    subjects.LIMITS_RENEW,
                    LimitRenew(ingress=self.ingress, request_ids=tuple(self.running)),
                )
            if self._owed:
                self._pay()
            # The state events keep the view current; this re-read mends a lost one.
            await self.refresh(min(_GET_TIMEOUT_S, self.settings.lease_ttl_seconds / 3))
