"""RatePace: one route's rate limit (one key's, of requests or of tokens) as its provider
reports it, paced so that the model sends it no request the provider would refuse;
RoutePaces: one model's paces by route and key, and what its routes' answers said is spent
(pure state; times in seconds on the owner's clock).

A provider that meters requests (OpenAI, Azure, Anthropic, most compatible servers) says on
each answer how many requests its limit allows (``limit``), how many were left once it took
that one (``remaining``) and when the whole allowance is back (``reset_seconds``): a bucket
that refills one request every ``reset / (limit - remaining)`` seconds. The answer comes back
a time to first token after its request was sent (a fallback's: after it was moved there),
and the requests sent meanwhile have spent from what it reports; so the estimate is what it
reported, less those, plus what refilled since it was sent, and every request sent to the
route takes one from it (a plan the ingress then never sends gives it back). A route whose
estimate is under one request is spent until one refills: the strategies spill past it
(``LearnedLimit.spent_until``), where without a pace they would have sent it the request its
provider refuses with a 429 and a ``Retry-After`` that keeps it cooling for longer than the
refill. The estimate is only as good as the provider's word: a 429 still cools the route
for what it asks.

A token limit (``RateReport.tokens``) is paced the same way in tokens: each request takes
its prompt's estimate plus its ``max_tokens`` (``output_cap``: what OpenAI and Anthropic
reserve while it runs, giving back what the answer did not use when it ends, which the next
report says), or without a cap the output the model's answers have averaged; and a request
is not sent where less is left than it takes (``room_at``: requests vary a hundredfold in
size, so no one threshold of a route would do). A provider that meters output apart
(Anthropic: ``RateReport.output_tokens``) has two token paces, its input limit taking the
prompt and its output limit the output; a request is sent where both have room. A
request's size is the pair (prompt, output) (:data:`Size`).
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from actors.state.learned_limit import LearnedLimit
    from schemas.routing import RateReport

_NEVER = -math.inf
Size = tuple[float, float]  # (prompt, output) tokens of a request
# A request's prompt tokens, output cap (None: none) and, without one, thinking budget.
Asked = tuple[int, int | None, int]
# What a send took of (the token pace, the output pace), and whether the two were apart then.
Taken = tuple[float, float, bool]
_UNSENT_KEPT = 1024  # the numbers of plans never sent, per route, kept to correct counts
_TOKENS_WEIGHT = 0.05  # a new answer's weight in the tokens a request is expected to take
_OUTPUT_ROOM = 2.0  # the room a request is sent with for its answer, in average answers


class RatePace:
    """Owns one route's estimate of what its provider's rate limit has left (in requests or
    in tokens). ``floor``: the least it may estimate (-inf: requests sent past none left
    are owed, and keep the route spent until they have refilled)."""

    __slots__ = ("_at", "_floor", "_left", "_limit", "_refill", "taken")

    def __init__(self, floor: float = -math.inf) -> None:
        self._floor = floor
        self._limit = 0.0
        self._refill: float | None = None  # seconds for one unit to come back
        self._left = 0.0  # units left at ``_at``
        self._at = _NEVER
        self.taken = 0.0  # what the last request sent took of it (less than asked at the floor)

    def reported(self, report: RateReport, sent_at: float, sent_since: float, now: float) -> float:
        """An answer to a request sent at ``sent_at``, ``sent_since`` units ago (what the
        requests sent after it took), reported ``report``; returns until when the route is
        spent (-inf: it is not)."""
        self._limit = float(report.limit)
        used = report.limit - report.remaining
        # A full allowance says nothing of how fast it refills, nor does a reset already
        # past (a clock apart from the provider's): the last refill known stays.
        if used > 0 and report.reset_seconds > 0:
            self._refill = report.reset_seconds / used
        refill = self._refill
        if refill is None:
            return _NEVER
        back = max(0.0, now - sent_at) / refill
        self._left = max(self._floor, min(self._limit, report.remaining + back) - sent_since)
        self._at = now
        return self._spent_until(now)

    def sent(self, now: float, units: float = 1.0) -> float:
        """A request taking ``units`` was sent; returns until when the route is spent (-inf:
        it is not)."""
        if self._refill is None:
            self.taken = 0.0
            return _NEVER
        level = self._level(now)
        self._left = max(self._floor, level - units)
        self.taken = level - self._left
        self._at = now
        return self._spent_until(now)

    def unsent(self, now: float, units: float = 1.0) -> float:
        """A request counted as sent never was: the ``units`` it took are given back;
        returns until when the route is spent (-inf: it is not)."""
        if self._refill is None:
            return _NEVER
        self._left = min(self._limit, self._level(now) + units)
        self._at = now
        return self._spent_until(now)

    def room_at(self, units: float, now: float) -> float:
        """When a request taking ``units`` fits (all of the limit, if it is larger); -inf:
        it does now."""
        refill = self._refill
        if refill is None:
            return _NEVER
        need = units if units < self._limit else self._limit
        lacking = need - self._level(now)
        return _NEVER if lacking <= 0.0 else now + lacking * refill

    def _level(self, now: float) -> float:
        refill = self._refill
        if refill is None:
            return self._limit
        # A clock stepped back refills nothing (never a negative refill).
        return min(self._limit, self._left + max(0.0, now - self._at) / refill)

    def _spent_until(self, now: float) -> float:
        if self._left >= 1.0 or self._refill is None:
            return _NEVER
        return now + (1.0 - self._left) * self._refill


class _Lane:
    """One (route, key)'s numbered sends, plans never sent and paces."""

    __slots__ = (
        "output_pace",
        "pace",
        "paced",
        "reset_by",
        "sent",
        "size",
        "token_pace",
        "tokens_reset_by",
        "unsent",
    )

    def __init__(self) -> None:
        self.sent = 0  # requests counted as sent, ever
        self.size: Size = (0.0, 0.0)  # the tokens they were estimated to take, ever
        # The numbers and sizes of plans never sent (the last ones).
        self.unsent: deque[tuple[int, Size]] | None = None
        self.pace: RatePace | None = None
        self.token_pace: RatePace | None = None  # input and output, or input only
        self.output_pace: RatePace | None = None  # output, when metered apart
        self.paced = _NEVER  # its paces say spent until then
        # The number of the request whose report set the request pace last, and the token
        # paces: those sent before it and never sent at all are not in them (0: every one in
        # flight was taken off).
        self.reset_by = self.tokens_reset_by = 0

    def since(self, number: int, mark: Size) -> tuple[int, Size]:
        """The requests, and their size, sent after the one numbered ``number`` (``mark``
        had been sent with it), less those never sent."""
        requests, prompt, output = self.sent - number, *_minus(self.size, mark)
        for n, (p, o) in self.unsent or ():
            if n > number:
                requests, prompt, output = requests - 1, prompt - p, output - o
        return max(0, requests), (max(0.0, prompt), max(0.0, output))

    def units(self, size: Size) -> Size:
        """What a request of ``size`` takes of (the token pace, the output pace)."""
        prompt, output = size
        return (prompt, output) if self.output_pace is not None else (prompt + output, 0.0)

    def room_at(self, size: Size, now: float) -> float:
        """When a request of ``size`` fits its token paces (-inf: now, or none)."""
        on_tokens, on_output = self.units(size)
        at = _NEVER if self.token_pace is None else self.token_pace.room_at(on_tokens, now)
        if self.output_pace is not None:
            at = max(at, self.output_pace.room_at(on_output, now))
        return at


def _minus(a: Size, b: Size) -> Size:
    return a[0] - b[0], a[1] - b[1]


def _given_back(taken: Taken, size: Size, apart: bool) -> Size:
    """What goes back to (the token pace, the output pace) of a lane now metering input and
    output ``apart`` or not, of what a send of ``size`` ``taken`` when they were or were not:
    its prompt's part to the input, the rest to the output (a report between can turn the
    output limit apart, or back)."""
    on_tokens, on_output, was_apart = taken
    if was_apart == apart:
        return on_tokens, on_output
    if not apart:
        return on_tokens + on_output, 0.0
    to_input = min(on_tokens, size[0])
    return to_input, on_tokens - to_input


class RoutePaces:
    """Owns one model's paces, by route and key (a provider meters each key apart), the
    requests sent on each (numbered, so that a report can tell which were sent after it),
    the tokens a request is expected to take, and until when each route's answers said a
    limit is spent; keeps each route's ``LearnedLimit.spent_until`` the later of what its
    answers said and when the first of its keys (``keys_of``: its declared credential ids;
    none: the route's own limit, key "") has a request back: a route is spent only when all
    its keys are."""

    def __init__(
        self,
        limits: dict[str, LearnedLimit],
        *,
        enabled: bool = True,
        keys_of: Callable[[str], tuple[str, ...]] = lambda _: (),
        default_caps: Mapping[str, int] | None = None,
    ) -> None:
        self.enabled = enabled  # False: answers' reports pace nothing (what they say is spent)
        self._limits = limits
        # The max_tokens a route is sent for a request that sets none (Claude's), by endpoint.
        self._default_caps = default_caps or {}
        self._keys_of = keys_of
        self._lanes: dict[str, dict[str, _Lane]] = {e: {} for e in limits}  # by route, key
        self._said: dict[str, float] = {}  # endpoint -> an answer said spent until then
        self._output = 0.0  # the output tokens of an answer, on average (a moving one)
        self._answered = False
        self._token_routes: set[str] = set()  # the routes a token limit was reported for
        self.tokens_paced = False  # whether any answer reported a token limit (read per plan)

    def spent(self, endpoint: str, until: float) -> None:
        """``endpoint``'s provider said a limit of it is spent until ``until``."""
        if endpoint in self._limits:
            self._said[endpoint] = max(self._said.get(endpoint, _NEVER), until)
            self._apply(endpoint)

    def answered(self, completion_tokens: int) -> None:
        """A route answered a request with ``completion_tokens``: what the next requests are
        expected to take of a token limit moves toward it."""
        if not self._answered:  # the first answer is all that is known
            self._output, self._answered = float(completion_tokens), True
        else:
            self._output += (completion_tokens - self._output) * _TOKENS_WEIGHT

    def tokens(
        self, endpoint: str, prompt_tokens: int, output_cap: int | None = None, thinking: int = 0
    ) -> Size:
        """The size a request of ``prompt_tokens`` allowing ``output_cap`` output tokens
        (None: no cap, so the route's default cap plus the ``thinking`` budget asked, else the
        average answer) is expected to take of ``endpoint``'s token limits when sent."""
        output_cap = self._cap(endpoint, output_cap, thinking)
        return float(prompt_tokens), self._output if output_cap is None else float(output_cap)

    def room_needed(
        self, endpoint: str, prompt_tokens: int, output_cap: int | None = None, thinking: int = 0
    ) -> Size:
        """The size ``endpoint``'s token limits must have room for to be sent a request of
        ``prompt_tokens`` allowing ``output_cap`` output tokens: its prompt and its cap (or
        the route's default cap and ``thinking``), which the provider reserves; without one,
        room for an answer of ``_OUTPUT_ROOM`` times the average (its length is not known
        until it ends: a request that takes more than what is left draws a 429)."""
        output_cap = self._cap(endpoint, output_cap, thinking)
        if output_cap is not None:
            return float(prompt_tokens), float(output_cap)
        return float(prompt_tokens), _OUTPUT_ROOM * self._output

    def _cap(self, endpoint: str, output_cap: int | None, thinking: int) -> int | None:
        if output_cap is None and (default := self._default_caps.get(endpoint)) is not None:
            return default + thinking
        return output_cap

    def smallest(self) -> Size:
        """The room the smallest request needs: no prompt, an answer of twice the average
        (what a status calls spent: not even that fits)."""
        return 0.0, _OUTPUT_ROOM * self._output

    def sent(
        self, endpoint: str, key: str, now: float, size: Size = (0.0, 0.0)
    ) -> tuple[int, Size, Taken]:
        """Count a request sent to ``endpoint`` with ``key``, expected to take ``size``;
        returns its number there, the size sent there with it, and what it took of the key's
        token paces (what a give-back returns)."""
        lane = self._lanes[endpoint].get(key) or self._lane(endpoint, key)
        lane.sent += 1
        lane.size = (lane.size[0] + size[0], lane.size[1] + size[1])
        taken: Taken = (0.0, 0.0, False)
        if lane.pace is not None:
            lane.paced = lane.pace.sent(now)
            if lane.token_pace is not None:
                on_tokens, on_output = lane.units(size)
                lane.paced = max(lane.paced, lane.token_pace.sent(now, on_tokens))
                if lane.output_pace is not None:
                    lane.paced = max(lane.paced, lane.output_pace.sent(now, on_output))
                    taken = (lane.token_pace.taken, lane.output_pace.taken, True)
                else:
                    taken = (lane.token_pace.taken, 0.0, False)
            self._apply(endpoint)
        return lane.sent, lane.size, taken

    def unsent(
        self,
        endpoint: str,
        key: str,
        number: int,
        now: float,
        size: tuple[Size, Taken] = ((0.0, 0.0), (0.0, 0.0, False)),
    ) -> None:
        """The request counted as ``number`` on ``endpoint`` with ``key`` was never sent (a
        plan the ingress dropped: the caller's limits refused it, a candidate skipped);
        ``size``: what it was expected to take, and what it took of the key's token paces."""
        lane = self._lane(endpoint, key)
        if lane.unsent is None:
            lane.unsent = deque(maxlen=_UNSENT_KEPT)
        expected, taken = size
        lane.unsent.append((number, expected))
        on_tokens, on_output = _given_back(taken, expected, lane.output_pace is not None)
        # A report of a request sent after it set the paces from what the provider had left,
        # which never counted it: given back too, it would count twice.
        if number <= lane.tokens_reset_by:
            on_tokens = on_output = 0.0
        if lane.pace is not None:
            lane.paced = lane.pace.unsent(now, 1.0 if number > lane.reset_by else 0.0)
            if lane.token_pace is not None:
                lane.paced = max(lane.paced, lane.token_pace.unsent(now, on_tokens))
            if lane.output_pace is not None:
                lane.paced = max(lane.paced, lane.output_pace.unsent(now, on_output))
            self._apply(endpoint)

    def reported(
        self,
        endpoint: str,
        key: str,
        report: RateReport,
        now: float,
        sent: tuple[float, int, Size] | None,
        in_flight: tuple[int, Size],
    ) -> None:
        """An answer of ``endpoint`` with ``key`` reported its rate limits' state: ``sent``,
        when, as which number there and with what size sent there with it the reporting
        request was sent (None: not counted there, so every one of the ``in_flight``
        requests, and the size they were expected to take, may have been sent after it)."""
        if not self.enabled or endpoint not in self._limits:
            return
        lane = self._lane(endpoint, key)
        if lane.pace is None:
            lane.pace = RatePace()
        if sent is None:
            sent_at, (since, since_size), number = now, in_flight, 0
        else:
            sent_at, number, mark = sent
            since, since_size = lane.since(number, mark)
        lane.reset_by = number
        lane.paced = lane.pace.reported(report, sent_at, since, now)
        if report.tokens is not None:
            if lane.token_pace is None:
                # A request a provider refuses takes nothing of its tokens: one large request
                # sent where none were left would otherwise keep the route spent for the
                # refill of tokens it never took (measured on replay ``tokenlimited``; the
                # debt of requests sent past a spent request limit keeps a bursty route's
                # queue short: ``paper``).
                lane.token_pace = RatePace(floor=0.0)
                self._token_routes.add(endpoint)
                self.tokens_paced = True
            if report.output_tokens is None:
                lane.output_pace = None
            elif lane.output_pace is None:
                lane.output_pace = RatePace(floor=0.0)
            on_tokens, on_output = lane.units(since_size)
            lane.tokens_reset_by = number
            tokens = lane.token_pace.reported(report.tokens, sent_at, on_tokens, now)
            lane.paced = max(lane.paced, tokens)
            if lane.output_pace is not None and report.output_tokens is not None:
                output = lane.output_pace.reported(report.output_tokens, sent_at, on_output, now)
                lane.paced = max(lane.paced, output)
        self._apply(endpoint)

    def room_at(self, endpoint: str, size: Size, now: float) -> float:
        """When a request of ``size`` fits the token limits of one of ``endpoint``'s keys
        (-inf: now, or one of them is paced by none)."""
        if endpoint not in self._token_routes:
            return _NEVER
        soonest = math.inf
        for key in self._keys_of(endpoint) or ("",):
            at = self.key_room_at(endpoint, key, size, now)
            if at <= now:
                return _NEVER
            soonest = min(soonest, at)
        return soonest

    def key_room_at(self, endpoint: str, key: str, size: Size, now: float) -> float:
        """When a request of ``size`` fits the token limits of ``endpoint``'s ``key`` (-inf:
        now, or no token limit was reported for it)."""
        lane = self._lanes.get(endpoint, {}).get(key)
        return _NEVER if lane is None else lane.room_at(size, now)

    def key_spent(self, endpoint: str, key: str, now: float) -> bool:
        """Whether ``key`` of ``endpoint`` has nothing left at ``now`` (no request, or not a
        token), by its paces."""
        lane = self._lanes.get(endpoint, {}).get(key)
        return lane is not None and lane.paced > now

    def refresh(self, endpoint: str) -> None:
        """``endpoint``'s pool declares other keys now: whether it is spent is read again (a
        key added counts as free, a key removed no longer holds it open)."""
        if endpoint in self._limits:
            self._apply(endpoint)

    def _lane(self, endpoint: str, key: str) -> _Lane:
        lanes = self._lanes[endpoint]
        lane = lanes.get(key)
        if lane is None:
            lane = lanes[key] = _Lane()
        return lane

    def _apply(self, endpoint: str) -> None:
        lanes = self._lanes[endpoint]
        # A key that never reported (or was added since) may be sent: the route is not spent.
        back = min(
            lane.paced if (lane := lanes.get(key)) is not None else _NEVER
            for key in self._keys_of(endpoint) or ("",)
        )
        self._limits[endpoint].spent_until = max(self._said.get(endpoint, _NEVER), back)
