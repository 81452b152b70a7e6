"""SteeringView: the ingress's view of the steering owners, kept as a SteeringBook.

It follows ``llmgw.steering.state``, ``llmgw.steering.evidence`` and ``llmgw.chain.*.state``
from the moment it starts, then asks ``llmgw.steering.get`` for the whole picture; an event
heard before that answer wins over it. A chain the view does not know yet (created a moment
ago, its event still on the way) is asked of its owner once, on ``llmgw.chain.<name>.resolve``.
When no owner answers at start (an ingress started before the actors), it asks again in the
background until one does; and so each time the bus's connection is back after a loss (the
events sent meanwhile never arrive: a chain changed then would be routed stale for good).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

import msgspec

from gateway.auth.gate import follow, unfollow
from gateway.steering.resolver import SteeringBook, book_from
from schemas import (
    ChainGet,
    ChainState,
    Evidence,
    GatewayError,
    SteeringGet,
    SteeringSnapshot,
    SteeringState,
    subjects,
)
from schemas.catalog import AUTO, AXIS_SYNONYMS, ascii_lower, chain_name_problem

if TYPE_CHECKING:
    from bus import Bus
    from schemas.config import GatewayConfig, ModelConfig

logger = logging.getLogger(__name__)

_ASK_TIMEOUT = 2.0
_RETRY_SECONDS = 0.5
_UNKNOWN_SECONDS = 1.0
_UNKNOWN_MAX = 1000


class SteeringView:
    """Owns the ingress's current SteeringBook (rebuilt on every owner event)."""

    def __init__(self, bus: Bus, config: GatewayConfig) -> None:
        self._bus = bus
        self._catalogue: tuple[ModelConfig, ...] = config.models
        self._state = SteeringState()
        self._chains: dict[str, ChainState] = {}
        self._evidence: Evidence | None = None
        self._heard: set[str] = set()  # what an event told us since start ("state", "evidence")
        self._tasks: list[asyncio.Task[None]] = []
        self._unknown: dict[str, float] = {}  # chain name -> until when it is known unknown
        self.book = self._build()

    def _build(self) -> SteeringBook:
        return book_from(self._catalogue, self._state, self._chains, self._evidence)

    def reconfigure(self, config: GatewayConfig) -> None:
        """Rank over a reloaded catalogue."""
        self._catalogue = config.models
        self.book = self._build()

    async def start(self) -> None:
        """Follow the owners' events, then ask for the whole picture once."""
        for subject in (
            subjects.STEERING_STATE,
            subjects.STEERING_EVIDENCE,
            subjects.CHAIN_STATE_ANY,
        ):
            self._tasks.append(
                await follow(
                    self._bus, subject, self._on_event, name=f"llmgw:steering-view:{subject}"
                )
            )
        if not await self._ask():
            self._tasks.append(
                asyncio.create_task(self._ask_until_answered(), name="llmgw:steering-view:get")
            )
        self._tasks.append(asyncio.create_task(self._resync(), name="llmgw:steering-view:back"))

    async def aclose(self) -> None:
        """Stop following."""
        for task in self._tasks:
            await unfollow(task)
        self._tasks.clear()

    async def _ask_until_answered(self, *, force: bool = False) -> None:
        # Nothing to wait on: no owner answers yet, so ask again a moment later.
        while not await self._ask(force=force):  # noqa: ASYNC110
            await asyncio.sleep(_RETRY_SECONDS)

    async def _resync(self) -> None:
        while True:
            await self._bus.reconnected()
            await self._ask_until_answered(force=True)

    async def refresh(self) -> None:
        """Take the owners' whole picture now (after an admin change through this ingress,
        so the next request here sees it whatever the events' timing)."""
        await self._ask(force=True)

    async def _ask(self, *, force: bool = False) -> bool:
        try:
            snap = await self._bus.request(
                subjects.STEERING_GET,
                SteeringGet(),
                reply_type=SteeringSnapshot,
                timeout=_ASK_TIMEOUT,
            )
        except GatewayError:
            return False
        if not isinstance(snap, SteeringSnapshot):
            return False
        if force or "state" not in self._heard:
            self._state = snap.state
            self._chains = {c.name: c for c in snap.chains if c.name in snap.state.chains}
        if force or "evidence" not in self._heard:
            self._evidence = snap.evidence
        self.book = self._build()
        return True

    async def _on_event(self, msg: object) -> None:
        match msg:
            case SteeringState() as state:
                self._heard.add("state")
                self._state = state
                self._chains = {n: c for n, c in self._chains.items() if n in state.chains}
            case ChainState() as chain:
                if chain.name not in self._state.chains and "state" in self._heard:
                    return  # a deleted chain's last word
                self._chains[chain.name] = chain
            case Evidence() as ev:
                self._heard.add("evidence")
                self._evidence = ev
            case _:
                return
        self.book = self._build()

    async def book_for(self, name: str) -> SteeringBook:
        """The book to resolve model field ``name`` with; a chain it does not know yet is
        asked of its owner first (so a chain created a moment ago resolves at once)."""
        book = self.book
        suffix = ascii_lower(name[len(AUTO) + 1 :])
        if suffix and suffix not in book.chains and suffix not in AXIS_SYNONYMS:
            if chain_name_problem(suffix) is not None:
                # No chain can have this name: nothing to ask (and a name longer than a bus
                # subject may be would cost this ingress its NATS connection).
                return book
            # A name just found unknown is not asked again for a second: a client sending
            # made-up names must not cost a bus request each.
            now = time.monotonic()
            if self._unknown.get(suffix, 0.0) > now:
                return book
            if not await self.learn_chain(suffix):
                if len(self._unknown) >= _UNKNOWN_MAX:
                    self._unknown.clear()
                self._unknown[suffix] = now + _UNKNOWN_SECONDS
            book = self.book
        return book

    async def learn_chain(self, name: str) -> bool:
        """Ask the owner of chain ``name`` (not in the view yet); True when it exists."""
        with contextlib.suppress(GatewayError):
            reply = await self._bus.request(
                subjects.chain_resolve(name),
                ChainGet(),
                reply_type=ChainState,
                timeout=_ASK_TIMEOUT,
            )
            if isinstance(reply, ChainState):
                self._chains[reply.name] = reply
                if reply.name not in self._state.chains:
                    self._state = msgspec.structs.replace(
                        self._state, chains=(*self._state.chains, reply.name)
                    )
                self.book = self._build()
                return True
        return False
