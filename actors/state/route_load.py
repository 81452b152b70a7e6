"""RouteLoad: one model's requests in flight per route and each route's learned concurrency
limit (a ``LearnedLimit``, ``actors/state/learned_limit.py``); pure state, no I/O; times in
seconds on the owner's clock.

**In flight.** The ModelActor issues every plan and sees every observation, so it counts what
each route is serving without another bus message: a plan's primary counts from the moment
the plan is issued; an observation of that attempt ends it, or (a failure) moves it to the
next candidate of the plan, which the failover loop tries next; an observation naming a later
candidate moves it there (a candidate skipped between); an answer from one it moved on from
(retried on its next key, a hedge's primary outliving its backup) ends it, as a failure of
an attempt already relayed to the client does (a stream broken after its first chunk goes
to no other route). A candidate the ingress never sends (``FirstToken.unsent``: its pool had
no lease for it, a context-length refusal ruled it out, the caller's limits refused the
plan) moves it to the next, as a failure does, since the ingress goes on to that one (or
gives it back too); the last ends it. A hedged plan's backup runs beside its primary: its
answer ends the request there, its failure or cancellation only takes it out of the plan,
and the primary declined for it (a stream's race, decided at the first token) moves it there.
Whatever is still counted after ``ttl`` seconds (its ingress died, an observation was lost)
expires, so a count that drifts heals by itself.

**Pace.** A route whose answers report its provider's request rate limit (``reported``) is
also at its limit while the requests that limit has left, as estimated from them and from
what was sent since (``RatePace``), are spent; as is one whose answer said a limit is spent
(``spent``), until when it said.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from actors.state.learned_limit import LearnedLimit
from actors.state.rate_pace import Asked, RoutePaces, Size, Taken

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from schemas.routing import RateReport


class Keyed(Protocol):
    """A plan's candidate as the count reads it: its route and the key it was given."""

    @property
    def endpoint(self) -> str: ...

    @property
    def credential_id(self) -> str: ...


def _key_of(candidates: Sequence[Keyed], endpoint: str) -> str:
    """The key the plan gave its candidate ``endpoint`` ("": none, or a route without keys)."""
    for c in candidates:
        if c.endpoint == endpoint:
            return c.credential_id
    return ""


@dataclass(slots=True)
class _Flight:
    endpoint: str
    issued: float
    at_send: int  # others in flight on ``endpoint`` when it was counted
    rest: tuple[str, ...]  # the plan's later candidates, in order
    passed: tuple[str, ...] = ()  # the candidates it moved on from
    seq: int = 0  # its number among the requests sent to ``endpoint`` with ``key``
    mark: Size = (0.0, 0.0)  # the size sent to ``endpoint`` with ``key``, it included
    asked: Asked = (0, None, 0)  # its prompt tokens, output cap and thinking budget
    size: Size = (0.0, 0.0)  # the (prompt, output) tokens it is expected to take there
    taken: Taken = (0.0, 0.0, False)  # what it took of its key's token paces (see rate_pace)
    sent_at: float = 0.0  # when it was sent to ``endpoint`` (issued, or moved there)
    keys: Sequence[Keyed] = ()  # the plan's candidates: the key each was given
    key: str = ""  # the key it was sent to ``endpoint`` with ("": none)
    hedge: str = ""  # the backup a hedged plan may send beside its primary, until it ends


class RouteLoad:
    """Owns one model's in-flight counts and learned limits, by endpoint."""

    def __init__(
        self,
        caps: dict[str, int | None],
        *,
        ttl: float,
        min_limit: float = 2.0,
        inflation: float = 2.0,
        pacing: bool = True,
        keys_of: Callable[[str], tuple[str, ...]] = lambda _: (),
        default_caps: Mapping[str, int] | None = None,
    ) -> None:
        self.limits = {e: LearnedLimit(cap, min_limit, inflation) for e, cap in caps.items()}
        self.counts = dict.fromkeys(caps, 0)  # endpoint -> in flight (read only outside)
        self._flights: OrderedDict[str, _Flight] = OrderedDict()
        self._ttl = ttl
        self.paces = RoutePaces(
            self.limits, enabled=pacing, keys_of=keys_of, default_caps=default_caps
        )

    def in_flight(self, endpoint: str) -> int:
        """Requests counted on ``endpoint`` now."""
        return self.counts.get(endpoint, 0)

    def saturated(self, endpoint: str, now: float = -math.inf) -> bool:
        """Whether ``endpoint`` is at its learned limit (or its provider's spent one) at
        ``now``."""
        lim = self.limits.get(endpoint)
        return lim is not None and not lim.admits(self.counts.get(endpoint, 0), now)

    def spent(self, endpoint: str, until: float) -> None:
        """``endpoint``'s provider said a limit of it is spent until ``until``."""
        self.paces.spent(endpoint, until)

    def reported(
        self, request_id: str, endpoint: str, key: str, report: RateReport, now: float
    ) -> None:
        """An answer of ``endpoint`` with ``key`` to ``request_id`` reported its rate limits'
        state: that key is paced by it from now on (``actors/state/rate_pace.py``)."""
        if endpoint not in self.counts:
            return
        f = self._flights.get(request_id)
        if f is not None and f.endpoint == endpoint and f.key == key:
            sent = (f.sent_at, f.seq, f.mark)
            self.paces.reported(endpoint, key, report, now, sent, (0, (0.0, 0.0)))
            return
        # Not counted there (expired, retried on a spare key, a hedge's backup): every one in
        # flight on that key may have been sent after it (a rare path: the flights are read).
        flying = [g for g in self._flights.values() if g.endpoint == endpoint and g.key == key]
        sizes = (math.fsum(g.size[0] for g in flying), math.fsum(g.size[1] for g in flying))
        in_flight = (len(flying), sizes)
        self.paces.reported(endpoint, key, report, now, None, in_flight)

    def succeeded(
        self,
        endpoint: str,
        ttft_ms: float,
        at_send: int,
        now: float,
        held_ms: float | None = None,
    ) -> bool:
        """Feed an answer to ``endpoint``'s limit (see :meth:`LearnedLimit.succeeded`),
        judged against the inflation the model's other routes share; True if it changed."""
        lim = self.limits.get(endpoint)
        if lim is None:
            return False
        ratios = [
            other.recent_ms / other.baseline_ms
            for e, other in self.limits.items()
            if e != endpoint and other.recent_ms is not None and other.baseline_ms
        ]
        return lim.succeeded(ttft_ms, at_send, now, min(ratios) if ratios else None, held_ms)

    def issued(
        self,
        request_id: str,
        endpoints: tuple[str, ...],
        now: float,
        keys: Sequence[Keyed] = (),
        asked: Asked = (0, None, 0),
        hedge: str = "",
    ) -> None:
        """A plan was issued for ``request_id``: its first candidate is in flight (``keys``:
        the plan's candidates, by which the key it gives each is known; ``asked``: the
        request's prompt tokens and output cap, by which it takes of the token limits;
        ``hedge``: the candidate the ingress may send beside the first, "" for none)."""
        self.expire(now)
        if not request_id or not endpoints or request_id in self._flights:
            return
        first, rest = endpoints[0], endpoints[1:]
        if first not in self.counts:
            return
        key = _key_of(keys, first)
        size = self.paces.tokens(first, *asked)
        seq, mark, taken = self.paces.sent(first, key, now, size)
        self._flights[request_id] = _Flight(
            first,
            now,
            self.counts[first],
            rest,
            seq=seq,
            mark=mark,
            asked=asked,
            size=size,
            taken=taken,
            sent_at=now,
            keys=keys,
            key=key,
            hedge=hedge if hedge in rest else "",
        )
        self.counts[first] += 1

    def unsent(self, request_id: str, endpoint: str, now: float = -math.inf) -> None:
        """The ingress will not send the candidate ``endpoint`` of ``request_id``: if it is
        counted there, its pace gets it back and it moves to the plan's next candidate, which
        the ingress tries next (or also gives back), or ends with the last; if it is still
        ahead (a hedge's backup its pool refused while the primary runs), a failure no longer
        moves it there."""
        f = self._flights.get(request_id)
        if f is None:
            return
        if f.endpoint == endpoint:
            self.paces.unsent(endpoint, f.key, f.seq, now, (f.size, f.taken))
            if f.rest:
                self._move(f, f.rest[0], now)
            else:
                self._end(request_id, f)
        elif endpoint in f.rest:
            f.rest = tuple(e for e in f.rest if e != endpoint)
            f.hedge = "" if f.hedge == endpoint else f.hedge

    def observed(
        self,
        request_id: str,
        endpoint: str,
        outcome: str,
        now: float,
        *,
        committed: bool = False,
        lost_race: bool = False,
    ) -> tuple[int, bool]:
        """An attempt of ``request_id`` on ``endpoint`` ended with ``outcome``: returns how
        many others were in flight on that route when it was sent (-1: unknown, not counted
        here) and whether the request goes on to another candidate of this plan (never after
        a ``committed`` attempt: a stream that broke once relayed is not sent again)."""
        f = self._flights.get(request_id)
        if f is None:
            return -1, False
        if endpoint != f.endpoint and endpoint == f.hedge:
            # The backup sent beside the primary: its answer ends the request (the primary is
            # cancelled); else the primary runs on, a failure of it goes past the backup, and
            # the backup's answer on a spare key ends the request.
            if outcome == "success":
                self._end(request_id, f)
            else:
                f.rest, f.hedge = tuple(e for e in f.rest if e != endpoint), ""
                f.passed = (*f.passed, endpoint)
            return -1, False
        if lost_race and endpoint == f.endpoint and f.hedge:
            # A stream's race is decided at its first token, the loser observed then and the
            # winner once it ends: the count goes to the backup, which is streaming.
            self._move(f, f.hedge, now)
            return -1, False
        if endpoint != f.endpoint:
            if endpoint in f.passed and outcome != "failure":
                # A route it moved on from answered after all (retried on its next key, or a
                # hedge's primary outliving its failed backup): the request ends there.
                self._end(request_id, f)
                return -1, False
            if endpoint not in f.rest:
                return -1, False  # a hedge's other side, or another plan's route
            self._move(f, endpoint, now)
        at_send = f.at_send
        if outcome == "failure" and f.rest and not committed:
            self._move(f, f.rest[0], now)
            return at_send, True
        self._end(request_id, f)
        return at_send, False

    def _move(self, f: _Flight, endpoint: str, now: float) -> None:
        if f.endpoint in self.counts:
            self.counts[f.endpoint] -= 1
        f.rest = f.rest[f.rest.index(endpoint) + 1 :]
        f.passed = (*f.passed, f.endpoint)
        f.endpoint, f.hedge = endpoint, ""
        f.at_send = self.counts.get(endpoint, 0)
        if endpoint in self.counts:
            f.key = _key_of(f.keys, endpoint)
            f.size = self.paces.tokens(endpoint, *f.asked)
            f.seq, f.mark, f.taken = self.paces.sent(endpoint, f.key, now, f.size)
            f.sent_at = now
            self.counts[endpoint] += 1

    def _end(self, request_id: str, f: _Flight) -> None:
        del self._flights[request_id]
        if f.endpoint in self.counts:
            self.counts[f.endpoint] -= 1

    def expire(self, now: float) -> int:
        """Forget flights issued more than ``ttl`` ago; returns how many."""
        n = 0
        while self._flights:
            rid, f = next(iter(self._flights.items()))
            if f.issued > now - self._ttl:
                break
            self._end(rid, f)
            n += 1
        return n
