"""RouteWise hedging in the failover loop: race a backup against a slow primary.

When a plan carries ``hedge_after_ms`` (a RouteWise model with ``latency_hedge_mode:
probability_target`` whose primary is unlikely to meet its SLO), the dispatcher starts the
primary; if it has no first token (a stream's first chunk that carries one, see
``adapters.base.carries_token``, not a role-only chunk; a whole answer) by then, it also
starts the plan's second candidate. The first to produce one serves the client; the other is
cancelled and observed as declined (outcome ``cancelled``, error kind ``hedge_declined``), so
the relay never mixes the two. A side that fails leaves the race to the other; both failing
hands both errors back to the failover loop. Each side is one ordinary attempt, observed as
such: both are accounted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

import anyio

from gateway.ingress.failover import NO_BACKUP, no_backup
from schemas import HEDGE_DECLINED, UpstreamError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from gateway.ingress.dispatch import Budget, Dispatcher, Failures
    from gateway.ingress.failover import AttemptKind
    from gateway.ingress.request_info import Attempt, RequestInfo

R = TypeVar("R")
P = TypeVar("P")

T = TypeVar("T")

DECLINED = HEDGE_DECLINED


@dataclass
class Declined:
    """Set on the side the race cancels because the other won: its attempt is observed as
    declined, not as a client cancellation."""

    declined: bool = False

    def error(self, endpoint: str) -> UpstreamError | None:
        """The error its cancelled attempt is observed with (None: a plain cancellation)."""
        if not self.declined:
            return None
        return UpstreamError(
            "declined: the hedged twin answered first", endpoint=endpoint, kind=DECLINED
        )


Side = Callable[[Declined], Awaitable["T | UpstreamError"]]


@dataclass
class Raced(Generic[T]):
    """The outcome: ``winner`` (0 primary, 1 backup, None) and each side's result, the
    loser's None when it was cancelled."""

    winner: int | None
    results: list[T | UpstreamError | None] = field(default_factory=list)


async def race(
    primary: Side[T], backup: Side[T], after_ms: float, discard: Callable[[T], Awaitable[None]]
) -> Raced[T]:
    """Run ``primary``; after ``after_ms`` without its result (or once it failed) also
    ``backup``; the first success wins and the other side is cancelled (or, finished too
    late, ``discard``-ed). Cancelling the race cancels both sides, and discards a side that
    had already succeeded (nobody will read it: a stream's lease and connection would
    leak)."""
    flags = (Declined(), Declined())
    tasks = [asyncio.ensure_future(primary(flags[0]))]
    results: list[T | UpstreamError | None] = [None, None]
    gone: set[int] = set()  # the sides already discarded
    handed = False  # the outcome went to the caller
    try:
        done, _ = await asyncio.wait(tasks, timeout=after_ms / 1000.0)
        if done and not isinstance(first := tasks[0].result(), UpstreamError):
            handed = True
            return Raced(winner=0, results=[first, None])  # no hedge was needed
        # The primary is slow (hedge now) or failed early (the backup is next in line anyway).
        tasks.append(asyncio.ensure_future(backup(flags[1])))
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                side = tasks.index(task)
                results[side] = task.result()
            winners = [
                i for i in (0, 1) if tasks[i] in done and not isinstance(results[i], UpstreamError)
            ]
            if winners:
                won = winners[0]
                await _end(tasks[1 - won], flags[1 - won], results, 1 - won, discard, gone)
                handed = True
                return Raced(winner=won, results=results)
        handed = True
        return Raced(winner=None, results=results)
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        # Shielded: a race stopped by its request's cancel scope still waits for its sides
        # to end, and discards what nobody will read.
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)
            if not handed:
                for side, task in enumerate(tasks):
                    if side not in gone and (unread := _success(task)) is not None:
                        await discard(unread)


def _success(task: asyncio.Future[T | UpstreamError]) -> T | None:
    """What ``task`` ended with, unless it was cancelled, raised or failed (None then)."""
    if not task.done() or task.cancelled() or task.exception() is not None:
        return None
    result = task.result()
    return None if isinstance(result, UpstreamError) else result


async def _end(
    task: asyncio.Future[T | UpstreamError],
    flag: Declined,
    results: list[T | UpstreamError | None],
    side: int,
    discard: Callable[[T], Awaitable[None]],
    gone: set[int],
) -> None:
    """Stop the losing side: cancel it, or discard what it produced meanwhile (noted in
    ``gone``)."""
    if not task.done():
        flag.declined = True
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        results[side] = None
        return
    late = task.result()
    if not isinstance(late, UpstreamError):
        gone.add(side)
        await discard(late)
        results[side] = None


async def backup_for(a: Attempt, attempts: AsyncIterator[Attempt]) -> Attempt | None:
    """The attempt to race against ``a`` (the plan's second candidate, the next of
    ``attempts``) in a plan that asks for a hedge, when ``a`` is the request's very first
    attempt; else None. A backup on a capacity route arrives unleased (see
    ``Dispatcher._attempts``): its side leases it when the hedge fires, so a primary that
    answers in time never holds a lease for it."""
    if a.number != 1 or not a.first_of_plan or not a.more:
        return None
    backup = await anext(attempts, None)
    if backup is None or backup.candidate.refusal:
        return None  # a refused route is accounted by the loop's next turn, not raced
    return backup


def raced_failures(
    pair: tuple[Attempt, Attempt], results: Sequence[object], failures: Failures
) -> None:
    """Record the errors of a race nobody won in ``failures`` (a backup its pool refused is
    none)."""
    for side, res in zip(pair, results, strict=True):
        if isinstance(res, UpstreamError) and res.kind != NO_BACKUP:
            failures.add(res, side.candidate)


async def backup_side(
    d: Dispatcher,
    kind: AttemptKind[R, P],
    info: RequestInfo,
    payload: P,
    a: Attempt,
    budget: Budget,
    declined: Declined,
) -> R | UpstreamError:
    """The race's backup side: ``a`` leased as it starts (refused: the primary races alone),
    then one ordinary attempt of ``kind`` (held to its first token, as the primary)."""
    leased = await d.leased_late(info, a)
    if leased is None:
        return no_backup(a.candidate)
    return await kind.attempt(d, info, payload, leased, budget, declined, True)
