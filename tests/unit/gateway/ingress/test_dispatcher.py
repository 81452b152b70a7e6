"""The Dispatcher (the failover loop) on a scripted in-process adapter and an injected clock.

The adapter here is a stand-in for the upstream *seam*, not for an upstream: each endpoint
gets a script of what its attempts do (answer, fail with a status, hang, stream some chunks
and then break). The clock is a plain counter the script advances, so the wall-clock budget,
latencies and time to first token are exact and no test waits for the budget to pass. The
per-attempt first-byte and idle timeouts run on the event loop; tests of those use limits of
a few milliseconds and assert what happened, never how long it took. Real HTTP adapters are
covered by tests/contract/test_adapter_contract.py; the loop through the real server by
tests/e2e/test_failover_openai_sdk.py.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest

from gateway.adapters.base import Batch, UpstreamTarget
from gateway.ingress.dispatch import Dispatcher
from gateway.ingress.pipeline import Inference
from gateway.ingress.plan_walk import PlanWalk, Targets
from gateway.ingress.relay import relay
from gateway.ingress.request_info import RequestInfo, Served
from gateway.ingress.surfaces import CHAT
from schemas import (
    CapacityRelease,
    FirstToken,
    InvalidRequestError,
    KeyPoolExhaustedError,
    KeyPoolRoleRestrictedError,
    Message,
    Observation,
    ProbeFirstByte,
    RouteCandidate,
    RoutePlan,
    UpstreamError,
    UpstreamTimeoutError,
    subjects,
)
from schemas.config import FailoverConfig, ModelConfig
from schemas.routing import RateReport
from schemas.text_chunk import chunk_json

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from bus import InProcessBus
    from gateway.adapters.base import JSON, Adapter
    from gateway.ingress.surfaces import StreamRenderer
    from schemas.pricing import Pricing

HI: JSON = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
SHORT = 0.02  # a first-byte or idle limit that a hanging script runs into at once


class FakeClock:
    """Seconds on a counter: only the scripts move it."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


# -- what an endpoint's attempt does ---------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """Answer after ``takes`` seconds on the clock (a stream: first chunk after ``takes``,
    the rest ``rest`` seconds later)."""

    text: str = "ok"
    takes: float = 0.0
    rest: float = 0.0
    usage: tuple[int, int] = (3, 5)


@dataclass(frozen=True)
class Fail:
    """Fail with ``status`` (None: no answer at all) after ``takes`` seconds."""

    status: int | None = 500
    takes: float = 0.0
    retry_after: float | None = None
    message: str = "upstream failed"
    body: bytes = b""


@dataclass(frozen=True)
class Hang:
    """Never answer (until cancelled)."""


@dataclass(frozen=True)
class StreamThen:
    """Stream ``chunks`` content chunks, then ``then``: a Fail, a Hang, or None (end with no
    finish reason)."""

    chunks: int = 1
    then: Fail | Hang | None = None


@dataclass(frozen=True)
class Whole:
    """Stream the whole answer in one read (one batch, the last), ``spent_for`` and ``rate``
    with it."""

    text: str = "ok"
    spent_for: float | None = None
    rate: RateReport | None = None


@dataclass(frozen=True)
class Bug:
    """Raise an error no upstream causes (the gateway's own bug) before any answer."""


@dataclass(frozen=True)
class Refuse:
    """Refuse the request as the client's (an adapter that cannot translate it) before any
    answer."""


Script = Answer | Fail | Hang | StreamThen | Whole | Bug | Refuse


def _chunk(text: str, *, finish: str | None = None, usage: tuple[int, int] | None = None) -> JSON:
    chunk: JSON = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }
    if usage is not None:
        chunk["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1]}
    return chunk


def _error(endpoint: str, f: Fail) -> UpstreamError:
    return UpstreamError(
        f.message,
        endpoint=endpoint,
        status=f.status,
        body=f.body,
        retry_after=f.retry_after,
        kind=f"http_{f.status}",
    )


@dataclass
class ScriptedAdapter:
    """Plays each endpoint's scripts in order; records every call and every closed stream."""

    clock: FakeClock
    scripts: dict[str, list[Script]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    targets: list[UpstreamTarget] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    entered: anyio.Event = field(default_factory=anyio.Event)

    def _next(self, target: UpstreamTarget) -> Script:
        self.calls.append(target.endpoint)
        self.targets.append(target)
        self.entered.set()
        script = self.scripts.get(target.endpoint) or [Answer()]
        return script.pop(0) if len(script) > 1 else script[0]

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        script = self._next(target)
        await anyio.lowlevel.checkpoint()  # like real I/O: a timeout of 0 lands here
        match script:
            case Answer(text=text, takes=takes, usage=usage):
                self.clock.advance(takes)
                return {
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]},
                }
            case Fail(takes=takes) as f:
                self.clock.advance(takes)
                raise _error(target.endpoint, f)
            case Bug():
                raise KeyError("bug")
            case Refuse():
                raise InvalidRequestError("tools[0]: not for this upstream", param="tools[0]")
            case _:
                await anyio.sleep_forever()
                raise AssertionError("unreachable")

    async def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        script = self._next(target)
        try:
            await anyio.lowlevel.checkpoint()
            match script:
                case Answer(text=text, takes=takes, rest=rest, usage=usage):
                    self.clock.advance(takes)
                    yield Batch([_chunk(text)])
                    self.clock.advance(rest)
                    yield Batch([_chunk("", finish="stop", usage=usage)], last=True)
                case Fail(takes=takes) as f:
                    self.clock.advance(takes)
                    raise _error(target.endpoint, f)
                case Hang():
                    await anyio.sleep_forever()
                case Bug():
                    raise KeyError("bug")
                case Refuse():
                    raise InvalidRequestError("tools[0]: not for this upstream", param="tools[0]")
                case Whole(text=text, spent_for=spent_for, rate=rate):
                    chunks = [_chunk(text), _chunk("", finish="stop", usage=(1, 1))]
                    yield Batch(chunks, last=True, spent_for=spent_for, rate=rate)
                case StreamThen(chunks=n, then=then):
                    for i in range(n):
                        yield Batch([_chunk(f"part{i} ")])
                    if isinstance(then, Fail):
                        raise _error(target.endpoint, then)
                    if isinstance(then, Hang):
                        await anyio.sleep_forever()
        finally:
            self.closed.append(target.endpoint)

    async def embed(self, target: UpstreamTarget, body: JSON) -> JSON:
        raise AssertionError("the dispatcher tests do not embed")


class FixedTargets(Targets):
    """Every candidate resolves to the same limits; the secret is ``sk-<endpoint>``.
    ``timeout`` bounds a whole non-streaming answer, ``ttft`` a stream's first chunk."""

    def __init__(self, *, timeout: float = 30.0, ttft: float = 30.0, idle: float = 30.0) -> None:
        self._timeout = timeout
        self._ttft = ttft
        self._idle = idle
        self.prices: dict[str, Pricing | None] = {}  # unpriced: every attempt costs 0

    def resolve(self, c: RouteCandidate) -> UpstreamTarget:
        return UpstreamTarget(
            endpoint=c.endpoint,
            kind=c.kind,
            base_url="",
            upstream_model=c.upstream_model,
            api_key=f"sk-{c.endpoint}",
            timeout=self._timeout,
            connect_timeout=1.0,
            ttft_timeout=self._ttft,
            idle_timeout=self._idle,
        )


# -- the harness ------------------------------------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def adapter(clock: FakeClock) -> ScriptedAdapter:
    return ScriptedAdapter(clock)


class Heard:
    """Everything published on ``llmgw.>`` while a test ran, in order."""

    def __init__(self, bus: InProcessBus) -> None:
        self._bus = bus
        self._sub: Any = None
        self.messages: list[tuple[str, Message]] = []

    async def drain(self) -> Heard:
        while self._sub.pending:
            env = await anext(aiter(self._sub))
            self.messages.append((env.subject, env.message))
        return self

    def observations(self) -> list[Observation]:
        return [m for _, m in self.messages if isinstance(m, Observation)]

    def outcomes(self) -> list[tuple[str, int, str]]:
        return [(o.endpoint, o.attempt, o.outcome) for o in self.observations()]


@pytest.fixture
async def heard(bus: InProcessBus) -> AsyncIterator[Heard]:
    h = Heard(bus)
    async with bus.subscribe(subjects.PREFIX + ".>") as sub:
        h._sub = sub
        yield h


def cand(endpoint: str, **kw: Any) -> RouteCandidate:
    return RouteCandidate(endpoint=endpoint, kind="fake", upstream_model="um", **kw)


def plan(*candidates: RouteCandidate, model: str = "m", pinned: bool = False) -> RoutePlan:
    return RoutePlan(model=model, candidates=candidates, pinned=pinned)


@dataclass
class Harness:
    """One Dispatcher over the scripted adapter, the fake clock and the in-process bus."""

    bus: InProcessBus
    adapter: ScriptedAdapter
    clock: FakeClock
    heard: Heard
    failover: FailoverConfig = field(default_factory=FailoverConfig)
    targets: Targets = field(default_factory=FixedTargets)

    def dispatcher(self) -> Dispatcher:
        adapters: dict[str, Adapter] = {"fake": self.adapter}
        return Dispatcher(self.bus, adapters, self.targets, self.failover, clock=self.clock)

    def info(self, *, stream: bool = False, started_ago: float = 0.0) -> RequestInfo:
        return RequestInfo(
            request_id="req-1",
            surface="chat",
            stream=stream,
            started=self.clock() - started_ago,
        )

    async def call(
        self, p: RoutePlan, *, walk: PlanWalk | None = None, info: RequestInfo | None = None
    ) -> tuple[str, int]:
        """(endpoint that served, attempts) of a non-streaming request."""

        async def op(a: Adapter, target: UpstreamTarget, model: str) -> JSON:
            return await a.complete(target, HI)

        served = await self.dispatcher().call(info or self.info(), p, op, walk)
        return served.candidate.endpoint, served.attempts

    async def stream(
        self, p: RoutePlan, *, walk: PlanWalk | None = None, info: RequestInfo | None = None
    ) -> tuple[str, list[JSON]]:
        """(endpoint that served, every chunk) of a streamed request; the attempt is closed
        as a success, or as a failure with the error re-raised."""
        attempt = await self.dispatcher().open_stream(info or self.info(stream=True), p, HI, walk)
        chunks: list[JSON] = []
        try:
            async for batch in attempt.batches():
                chunks.extend(map(chunk_json, batch))
        except UpstreamError as err:
            await attempt.close("failure", err)
            raise
        await attempt.close("success")
        return attempt.candidate.endpoint, chunks


@pytest.fixture
def h(bus: InProcessBus, adapter: ScriptedAdapter, clock: FakeClock, heard: Heard) -> Harness:
    return Harness(bus, adapter, clock, heard)


def walk_of(
    h: Harness, plans: dict[str, RoutePlan], asked: list[str], info: RequestInfo
) -> PlanWalk:
    """A walk over ``plans``' models in order; ``asked`` records which were asked to plan."""

    async def ask(model: ModelConfig) -> RoutePlan:
        asked.append(model.id)
        return plans[model.id]

    models = tuple(ModelConfig.model_validate({"id": m}) for m in plans)
    return PlanWalk(models, ask)


@pytest.fixture(params=[False, True], ids=["once", "stream"])
def stream(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


async def serve(h: Harness, p: RoutePlan, stream: bool, **kw: Any) -> str:
    """The endpoint that served ``p``, streamed or not."""
    if stream:
        return (await h.stream(p, **kw))[0]
    return (await h.call(p, **kw))[0]


# -- the failover loop ------------------------------------------------------------------------


async def test_dispatcher_tries_candidates_in_plan_order_until_one_answers(
    h: Harness, stream: bool
) -> None:
    h.adapter.scripts = {"a": [Fail(500)], "b": [Fail(None)], "c": [Answer()], "d": [Answer()]}

    served = await serve(h, plan(cand("a"), cand("b"), cand("c"), cand("d")), stream)

    assert served == "c"
    assert h.adapter.calls == ["a", "b", "c"]
    heard = await h.heard.drain()
    assert heard.outcomes() == [("a", 1, "failure"), ("b", 2, "failure"), ("c", 3, "success")]
    assert [o.fallback for o in heard.observations()] == [False, True, True]


async def test_dispatcher_on_a_pinned_plan_never_falls_back_to_the_next_model(
    h: Harness, stream: bool
) -> None:
    h.adapter.scripts = {"a": [Fail(503)]}
    info = h.info(stream=stream)
    asked: list[str] = []
    walk = walk_of(h, {"m": plan(cand("a"), pinned=True), "n": plan(cand("b"))}, asked, info)

    with pytest.raises(UpstreamError) as err:
        await serve(h, await walk.first(), stream, walk=walk, info=info)

    assert (err.value.endpoint, err.value.status) == ("a", 503)
    assert asked == ["m"]
    assert h.adapter.calls == ["a"]


async def test_dispatcher_walks_to_the_next_models_plan_when_one_is_exhausted(
    h: Harness, stream: bool
) -> None:
    h.adapter.scripts = {"a": [Fail(500)], "b": [Answer()]}
    info = h.info(stream=stream)
    asked: list[str] = []
    walk = walk_of(h, {"m": plan(cand("a")), "n": plan(cand("b"), model="n")}, asked, info)

    served = await serve(h, await walk.first(), stream, walk=walk, info=info)

    assert (served, asked) == ("b", ["m", "n"])


async def test_dispatcher_observes_each_attempt_under_the_model_whose_plan_it_came_from(
    h: Harness, stream: bool
) -> None:
    # A hedge whose backup is the next model's route: fetching that plan mid-race must not
    # relabel the primary, which is still the first model's attempt.
    h.adapter.scripts = {"a": [Hang()], "b": [Answer()]}
    info = h.info(stream=stream)
    hedged = RoutePlan(model="m", candidates=(cand("a"),), hedge_after_ms=0.0)
    walk = walk_of(h, {"m": hedged, "n": plan(cand("b"), model="n")}, [], info)

    served = await serve(h, await walk.first(), stream, walk=walk, info=info)

    assert served == "b"
    heard = await h.heard.drain()
    assert sorted((o.endpoint, o.model) for o in heard.observations()) == [("a", "m"), ("b", "n")]


async def test_dispatcher_hop_cap_stops_after_max_attempts_and_gives_back_unattempted_probes(
    h: Harness, stream: bool
) -> None:
    h.failover = FailoverConfig(max_attempts=3)
    h.adapter.scripts = {e: [Fail(500)] for e in "abcde"}

    with pytest.raises(UpstreamError) as err:
        await serve(
            h, plan(cand("a"), cand("b"), cand("c"), cand("d", probe=True), cand("e")), stream
        )

    assert err.value.endpoint == "a"  # all 5xx: the primary's error
    assert h.adapter.calls == ["a", "b", "c"]
    heard = await h.heard.drain()
    # The probe lease d held is given back (a cancelled observation, attempt 0); e held none.
    assert heard.outcomes() == [
        ("a", 1, "failure"),
        ("b", 2, "failure"),
        ("c", 3, "failure"),
        ("d", 0, "cancelled"),
    ]


async def test_dispatcher_says_unsent_for_each_candidate_it_never_attempts(
    h: Harness, stream: bool
) -> None:
    h.failover = FailoverConfig(max_attempts=2)
    h.adapter.scripts = {e: [Fail(500)] for e in "abcd"}

    with pytest.raises(UpstreamError):
        await serve(h, plan(cand("a"), cand("b"), cand("c"), cand("d")), stream)

    heard = await h.heard.drain()
    # The ModelActor counts c as in flight once b failed: it must hear c (and d) will not be.
    unsent = [m.endpoint for subject, m in heard.messages if isinstance(m, FirstToken) and m.unsent]
    assert unsent == ["c", "d"]


async def test_dispatcher_hop_cap_counts_across_the_walk(h: Harness) -> None:
    h.failover = FailoverConfig(max_attempts=3)
    h.adapter.scripts = {e: [Fail(500)] for e in ("a", "b", "c", "d")}
    info = h.info()
    asked: list[str] = []
    walk = walk_of(
        h, {"m": plan(cand("a"), cand("b")), "n": plan(cand("c"), cand("d"))}, asked, info
    )

    with pytest.raises(UpstreamError):
        await h.call(await walk.first(), walk=walk, info=info)

    assert h.adapter.calls == ["a", "b", "c"]
    assert asked == ["m", "n"]


# -- the wall-clock budget --------------------------------------------------------------------


async def test_dispatcher_starts_no_retry_after_the_budget_ran_out(
    h: Harness, stream: bool
) -> None:
    h.failover = FailoverConfig(budget_seconds=0.3)
    # The primary fails at 0.1 s, the first retry at 0.5 s: past the budget.
    h.adapter.scripts = {"a": [Fail(500, takes=0.1)], "b": [Fail(503, takes=0.4)], "c": [Answer()]}

    with pytest.raises(UpstreamError) as err:
        await serve(h, plan(cand("a"), cand("b"), cand("c")), stream)

    assert (err.value.endpoint, err.value.status) == ("a", 500)  # the primary's error
    assert h.adapter.calls == ["a", "b"]


async def test_dispatcher_runs_the_first_retry_even_when_the_budget_is_spent(
    h: Harness, stream: bool
) -> None:
    h.failover = FailoverConfig(budget_seconds=0.3)
    h.adapter.scripts = {"a": [Fail(500, takes=5.0)], "b": [Answer(takes=5.0)]}

    served = await serve(h, plan(cand("a"), cand("b"), cand("c")), stream)

    assert served == "b"
    assert h.adapter.calls == ["a", "b"]


async def test_dispatcher_budget_cancels_a_silent_first_attempt_another_route_can_take_over(
    h: Harness, stream: bool
) -> None:
    h.failover = FailoverConfig(budget_seconds=0.3)
    h.adapter.scripts = {"a": [Hang()], "b": [Answer()]}
    # The budget is spent as the first attempt starts: its first-byte wait is cut to nothing.
    info = h.info(stream=stream, started_ago=0.3)

    served = await serve(h, plan(cand("a"), cand("b"), cand("c")), stream, info=info)

    assert served == "b"
    cut = (await h.heard.drain()).observations()[0]
    assert (cut.endpoint, cut.outcome, cut.error_kind) == ("a", "cancelled", "budget")
    if stream:
        assert "a" in h.adapter.closed  # the abandoned upstream stream was closed


async def test_dispatcher_budget_never_cuts_the_last_route_short(h: Harness, stream: bool) -> None:
    h.failover = FailoverConfig(budget_seconds=0.3)
    h.targets = FixedTargets(timeout=SHORT, ttft=SHORT)
    h.adapter.scripts = {"a": [Hang()]}

    with pytest.raises(UpstreamTimeoutError) as err:
        await serve(h, plan(cand("a")), stream, info=h.info(stream=stream, started_ago=10.0))

    # Bounded by its own limit, not the budget: an endpoint failure, not a cancel.
    assert err.value.kind == "ttft"
    (obs,) = (await h.heard.drain()).observations()
    assert (obs.outcome, obs.error_kind) == ("failure", "ttft")


async def test_dispatcher_budget_zero_disables_it(h: Harness) -> None:
    h.failover = FailoverConfig(budget_seconds=0)
    h.adapter.scripts = {
        "a": [Fail(500, takes=100.0)],
        "b": [Fail(500, takes=100.0)],
        "c": [Answer()],
    }

    assert await h.call(plan(cand("a"), cand("b"), cand("c"))) == ("c", 3)


async def test_dispatcher_fetches_no_next_plan_once_the_budget_is_spent(h: Harness) -> None:
    h.failover = FailoverConfig(budget_seconds=0.3)
    h.adapter.scripts = {"a": [Fail(500)], "b": [Fail(500, takes=1.0)]}
    info = h.info()
    asked: list[str] = []
    walk = walk_of(h, {"m": plan(cand("a"), cand("b")), "n": plan(cand("c"))}, asked, info)

    with pytest.raises(UpstreamError):
        await h.call(await walk.first(), walk=walk, info=info)

    assert asked == ["m"]


# -- first byte, idle, commitment -------------------------------------------------------------


async def test_dispatcher_stream_silent_before_its_first_byte_fails_over_at_its_ttft_limit(
    h: Harness,
) -> None:
    h.targets = FixedTargets(ttft=SHORT)
    h.adapter.scripts = {"a": [Hang()], "b": [Answer(text="from b")]}

    served, chunks = await h.stream(plan(cand("a"), cand("b")))

    assert served == "b"
    assert chunks[0]["choices"][0]["delta"]["content"] == "from b"
    assert h.adapter.closed[0] == "a"
    first = (await h.heard.drain()).observations()[0]
    assert (first.endpoint, first.outcome, first.error_kind) == ("a", "failure", "ttft")


async def test_dispatcher_stream_is_committed_after_its_first_chunk(h: Harness) -> None:
    h.adapter.scripts = {"a": [StreamThen(chunks=2, then=Fail(502))], "b": [Answer()]}

    with pytest.raises(UpstreamError) as err:
        await h.stream(plan(cand("a"), cand("b")))

    assert (err.value.endpoint, err.value.status) == ("a", 502)
    assert h.adapter.calls == ["a"]  # no fallback once content is out


async def test_dispatcher_stream_ending_without_a_finish_reason_fails_as_truncated(
    h: Harness,
) -> None:
    h.adapter.scripts = {"a": [StreamThen(chunks=2, then=None)]}

    with pytest.raises(UpstreamError) as err:
        await h.stream(plan(cand("a"), cand("b")))

    assert (err.value.endpoint, err.value.kind) == ("a", "truncated")


async def test_dispatcher_stream_stalled_after_its_first_chunk_fails_at_the_idle_limit(
    h: Harness,
) -> None:
    h.targets = FixedTargets(idle=SHORT)
    h.adapter.scripts = {"a": [StreamThen(chunks=1, then=Hang())]}

    with pytest.raises(UpstreamTimeoutError) as err:
        await h.stream(plan(cand("a"), cand("b")))

    assert (err.value.endpoint, err.value.kind) == ("a", "idle")
    assert h.adapter.closed == ["a"]
    (obs,) = (await h.heard.drain()).observations()
    assert (obs.outcome, obs.error_kind) == ("failure", "idle")


async def test_dispatcher_stream_publishes_first_token_for_the_primary_and_the_probe_verdict(
    h: Harness,
) -> None:
    h.adapter.scripts = {"a": [Answer()]}

    await h.stream(plan(cand("a", probe=True)))

    heard = await h.heard.drain()
    assert (subjects.model_first_token("m"), FirstToken(endpoint="a", request_id="req-1")) in (
        heard.messages
    )
    assert (
        subjects.endpoint_probe_result("a"),
        ProbeFirstByte(endpoint="a", request_id="req-1"),
    ) in heard.messages


async def test_dispatcher_stream_read_whole_at_once_leaves_the_prefill_lease_to_its_observation(
    h: Harness,
) -> None:
    # A stream whose first read is its whole answer is observed right after its relay, and
    # the observation releases the prefill lease: no FirstToken message is needed for it,
    # unless it says a provider limit is spent (which only that message carries).
    h.adapter.scripts = {"a": [Whole(), Whole(spent_for=3.0)]}

    await h.stream(plan(cand("a")))
    await h.stream(plan(cand("a")))

    heard = await h.heard.drain()
    said = [m for _, m in heard.messages if isinstance(m, FirstToken)]
    assert said == [FirstToken(endpoint="a", request_id="req-1", spent_for=3.0)]
    assert [o.outcome for o in heard.observations()] == ["success", "success"]


async def test_dispatcher_a_streams_reported_limit_goes_with_its_first_token_or_its_observation(
    h: Harness,
) -> None:
    # A primary's report reaches its model as soon as the stream begins (FirstToken); a
    # fallback's holds no prefill lease and sends no FirstToken: its observation says it.
    rate = RateReport(limit=10, remaining=4, reset_seconds=6.0)
    h.adapter.scripts = {"a": [Whole(rate=rate), Fail(500)], "b": [Whole(rate=rate)]}

    await h.stream(plan(cand("a")))
    await h.stream(plan(cand("a"), cand("b")))

    heard = await h.heard.drain()
    said = [m for _, m in heard.messages if isinstance(m, FirstToken)]
    assert said == [FirstToken(endpoint="a", request_id="req-1", rate=rate)]
    observed = [(o.endpoint, o.outcome, o.rate) for o in heard.observations()]
    assert observed == [("a", "success", None), ("a", "failure", None), ("b", "success", rate)]


class _Unrenderable:
    """A client shape that cannot express the upstream's chunks."""

    def feed(self, chunk: JSON) -> list[bytes]:
        raise KeyError("choices")

    def feed_all(self, chunks: list[JSON], out: bytearray) -> None:
        raise KeyError("choices")

    def finish(self) -> list[bytes]:
        return []

    def error(
        self, message: str, kind: str = "upstream_error", *, status: int | None = None
    ) -> list[bytes]:
        return [f"error: {message}".encode()]


class _Client:
    """The ASGI side of a streamed answer: what was written."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def start(self, status: int, headers: Any) -> None:
        pass

    async def chunk(self, data: bytes, *, more: bool = True) -> None:
        self.sent.append(data)


async def test_a_relay_that_fails_otherwise_ends_the_answer_in_its_error_and_observes_it(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    # Not only an upstream error or a cancellation: whatever ends a relay closes the stream
    # and observes it, which gives back its leases (the prefill one too: a stream read whole
    # at once sends no FirstToken). Its answer has begun: it ends in the dialect's error,
    # not a connection torn mid-body, and the failure is logged once, with its traceback;
    # a gateway bug is not held against the route.
    h.adapter.scripts = {"a": [Whole()]}
    info = h.info(stream=True)
    attempt = await h.dispatcher().open_stream(info, plan(cand("a")), HI)
    client = _Client()

    await relay(client, [], _Unrenderable(), attempt)  # type: ignore[arg-type]

    assert client.sent == [b"error: internal gateway error"]
    assert h.adapter.closed == ["a"]
    (obs,) = (await h.heard.drain()).observations()
    assert (obs.outcome, obs.error_kind) == ("cancelled", "internal")  # not the route's fault
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1 and isinstance(logged[0].exc_info[1], KeyError)  # type: ignore[index]


async def test_a_stream_whose_renderer_cannot_be_built_is_closed_and_observed_once(
    h: Harness,
) -> None:
    # Nothing reached the client yet (the app answers the error), but the upstream stream is
    # closed and the attempt observed: the observation ends the ModelActor's in-flight count
    # for the route, which otherwise stayed until its TTL.
    h.adapter.scripts = {"a": [Answer()]}
    d = h.dispatcher()

    def unbuildable(model: str, request: JSON) -> StreamRenderer:
        raise KeyError("stream_options")

    call = SimpleNamespace(
        req=_Client(),
        info=h.info(stream=True),
        plan=plan(cand("a")),
        body=HI,
        walk=None,
        requested="m",
        raw={},
        surface=dataclasses.replace(CHAT, stream=unbuildable),
    )

    targeting = SimpleNamespace(served=lambda walk, model, requested: requested)
    inference = SimpleNamespace(_dispatcher=d, _leases=d.leases, targeting=targeting)

    with pytest.raises(KeyError):
        await Inference._serve_stream(inference, call)  # type: ignore[arg-type]

    assert h.adapter.closed == ["a"]
    (obs,) = (await h.heard.drain()).observations()
    assert (obs.outcome, obs.error_kind) == ("cancelled", "internal")  # not the route's fault


# -- which error the client sees --------------------------------------------------------------


async def test_dispatcher_shows_the_first_request_describing_error_when_all_fail(
    h: Harness, stream: bool
) -> None:
    h.adapter.scripts = {
        "a": [Fail(500)],
        "b": [Fail(422, message="bad tool args")],
        "c": [Fail(400)],
    }

    with pytest.raises(UpstreamError) as err:
        await serve(h, plan(cand("a"), cand("b"), cand("c")), stream)

    assert (err.value.endpoint, err.value.status, err.value.message) == ("b", 422, "bad tool args")
    outcomes = (await h.heard.drain()).outcomes()
    assert outcomes == [("a", 1, "failure"), ("b", 2, "client_error"), ("c", 3, "client_error")]


async def test_dispatcher_context_refusal_rules_out_every_route_no_wider(h: Harness) -> None:
    refusal = Fail(400, body=b'{"error": {"code": "context_length_exceeded"}}')
    h.adapter.scripts = {"a": [refusal], "c": [Answer()]}

    served = await h.call(
        plan(
            cand("a", context_window=1000),
            cand("b", context_window=800),
            cand("c", context_window=2000),
        )
    )

    assert served == ("c", 2)
    assert h.adapter.calls == ["a", "c"]


# -- Retry-After and key-pool refusals --------------------------------------------------------


async def test_dispatcher_moves_on_at_once_from_a_rate_limited_route(
    h: Harness, stream: bool
) -> None:
    h.adapter.scripts = {"a": [Fail(429, retry_after=30.0)], "b": [Answer()]}
    before = h.clock()

    served = await serve(h, plan(cand("a"), cand("b")), stream)

    assert served == "b"
    assert h.adapter.calls == ["a", "b"]  # not retried on the same route
    assert h.clock() == before  # and nothing waited out the Retry-After
    limited = (await h.heard.drain()).observations()[0]
    assert (limited.endpoint, limited.outcome, limited.status, limited.retry_after) == (
        "a",
        "failure",
        429,
        30.0,
    )


async def test_dispatcher_every_route_rate_limited_answers_the_primarys_429_with_the_first_reset(
    h: Harness,
) -> None:
    # The primary's answer, saying when the first route is back (b in 5 s, not a in 30 s):
    # what the next request, refused with every route cooling, is told too.
    h.adapter.scripts = {"a": [Fail(429, retry_after=30.0)], "b": [Fail(429, retry_after=5.0)]}

    with pytest.raises(UpstreamError) as err:
        await h.call(plan(cand("a"), cand("b")))

    assert (err.value.status, err.value.endpoint, err.value.retry_after) == (429, "a", 5.0)


async def test_dispatcher_rate_limited_routes_one_of_which_gave_no_reset_keep_the_primarys(
    h: Harness,
) -> None:
    # b said nothing: it cools for the gateway's own short backoff, so "30 s" is all we know.
    h.adapter.scripts = {"a": [Fail(429, retry_after=30.0)], "b": [Fail(429)]}

    with pytest.raises(UpstreamError) as err:
        await h.call(plan(cand("a"), cand("b")))

    assert (err.value.status, err.value.retry_after) == (429, 30.0)


async def test_dispatcher_every_route_refused_for_keys_says_when_the_first_key_unmutes(
    h: Harness,
) -> None:
    p = plan(
        cand("a", refusal="key_pool_exhausted", retry_after=12.0),
        cand("b", refusal="key_pool_exhausted", retry_after=5.0),
    )

    with pytest.raises(KeyPoolExhaustedError) as err:
        await h.call(p)

    assert err.value.retry_after == 5.0
    assert h.adapter.calls == []  # nothing is sent on a refused route
    assert (await h.heard.drain()).outcomes() == [("a", 1, "failure"), ("b", 2, "failure")]


async def test_dispatcher_reservation_only_refusal_is_403_and_charges_no_endpoint(
    h: Harness,
) -> None:
    with pytest.raises(KeyPoolRoleRestrictedError):
        await h.call(plan(cand("a", refusal="key_pool_role_restricted")))

    assert (await h.heard.drain()).observations() == []


async def test_dispatcher_serves_from_a_later_route_when_an_earlier_one_refused_for_keys(
    h: Harness,
) -> None:
    served = await h.call(plan(cand("a", refusal="key_pool_exhausted", retry_after=3.0), cand("b")))

    assert served == ("b", 2)


# -- usage, timing, cancellation --------------------------------------------------------------


async def test_dispatcher_observation_carries_usage_and_latency_on_the_injected_clock(
    h: Harness,
) -> None:
    h.adapter.scripts = {"a": [Answer(takes=0.25, usage=(11, 7))]}

    await h.call(plan(cand("a")))

    (obs,) = (await h.heard.drain()).observations()
    assert (obs.prompt_tokens, obs.completion_tokens) == (11, 7)
    assert obs.latency_ms == pytest.approx(250.0)
    assert obs.ttft_ms is None


async def test_dispatcher_writes_a_whole_answer_before_settling_it(h: Harness) -> None:
    # The client is not kept waiting on the attempt's bookkeeping: ``then`` (the answer's
    # write) runs first, and the observation and the lease's return follow it, the attempt
    # still timed to its answer (not to the end of the write).
    h.adapter.scripts = {"a": [Answer(takes=0.25, usage=(11, 7))]}
    info = h.info()
    heard_at_write: list[Message] = []
    in_flight_at_write: list[float] = []

    async def write(served: Served) -> None:
        heard_at_write.extend(m for _, m in (await h.heard.drain()).messages)
        in_flight_at_write.append(info.record.upstream_s)
        h.clock.advance(5.0)  # a slow client

    async def op(a: Adapter, target: UpstreamTarget, model: str) -> JSON:
        return await a.complete(target, HI)

    leased = cand("a", pool="p", lease_id="l-1")
    d = h.dispatcher()
    d.leases.hold_plan(plan(leased))
    served = await d.call(info, plan(leased), op, None, write)

    assert served.settle is None
    assert heard_at_write == []
    assert in_flight_at_write == [pytest.approx(0.25)]  # the overhead header counts it
    (obs,) = (await h.heard.drain()).observations()
    assert (obs.outcome, obs.prompt_tokens, obs.latency_ms) == ("success", 11, 250.0)
    assert obs.ts < time.time() - 4.0  # stamped when the answer came, not after the write
    released = [m for _, m in h.heard.messages if isinstance(m, CapacityRelease)]
    assert released == [CapacityRelease(pool="p", lease_id="l-1", used_units=18.0)]


def _leased(h: Harness, d: Dispatcher) -> RoutePlan:
    """A plan of one candidate holding a capacity lease ``d``'s keeper holds."""
    p = plan(cand("a", pool="p", lease_id="l-1"))
    d.leases.hold_plan(p)
    return p


async def _released(h: Harness) -> list[CapacityRelease]:
    return [m for _, m in (await h.heard.drain()).messages if isinstance(m, CapacityRelease)]


@pytest.mark.parametrize("ending", ["cancelled", "failed"])
async def test_dispatcher_settles_a_whole_answer_however_its_write_ends(
    h: Harness, ending: str
) -> None:
    async def write(served: Served) -> None:
        if ending == "failed":
            raise OSError("the client's socket broke")
        await anyio.sleep_forever()

    async def op(a: Adapter, target: UpstreamTarget, model: str) -> JSON:
        return await a.complete(target, HI)

    d = h.dispatcher()

    async def call() -> None:
        await d.call(h.info(), _leased(h, d), op, None, write)

    if ending == "failed":
        with pytest.raises(OSError, match="socket broke"):
            await call()
    else:
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await anyio.wait_all_tasks_blocked()  # the answer is in, its write hangs
            tg.cancel_scope.cancel()

    (obs,) = h.heard.observations() or (await h.heard.drain()).observations()
    assert (obs.endpoint, obs.outcome) == ("a", "success")
    assert [r.lease_id for r in await _released(h)] == ["l-1"]


async def test_dispatcher_settles_a_whole_answer_while_its_write_waits_on_the_client(
    h: Harness,
) -> None:
    # A write that waits (a full socket, HTTP/2 flow control) does not hold the attempt's
    # lease and observation until a slow client reads: they are settled meanwhile.
    client_read = anyio.Event()
    settled_before_read: list[bool] = []

    async def write(served: Served) -> None:
        await client_read.wait()

    async def op(a: Adapter, target: UpstreamTarget, model: str) -> JSON:
        return await a.complete(target, HI)

    d = h.dispatcher()
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.call, h.info(), _leased(h, d), op, None, write)
        await anyio.wait_all_tasks_blocked()  # the write waits
        settled_before_read.append(bool(await _released(h)) and bool(h.heard.observations()))
        client_read.set()

    assert settled_before_read == [True]


async def test_dispatcher_gives_a_lease_back_when_the_answers_usage_is_not_numbers(
    h: Harness,
) -> None:
    async def op(a: Adapter, target: UpstreamTarget, model: str) -> JSON:
        answer = await a.complete(target, HI)
        answer["usage"] = {"prompt_tokens": "n/a", "completion_tokens": [1]}
        return answer

    async def write(served: Served) -> None:
        pass

    d = h.dispatcher()
    await d.call(h.info(), _leased(h, d), op, None, write)

    (obs,) = h.heard.observations() or (await h.heard.drain()).observations()
    assert (obs.outcome, obs.cost_estimated) == ("success", True)  # priced on the estimate
    assert [r.lease_id for r in await _released(h)] == ["l-1"]


async def test_dispatcher_stream_observation_has_time_to_first_token_and_final_usage(
    h: Harness,
) -> None:
    h.adapter.scripts = {"a": [Answer(takes=0.1, rest=0.2, usage=(4, 9))]}

    await h.stream(plan(cand("a")))

    (obs,) = (await h.heard.drain()).observations()
    assert (obs.outcome, obs.prompt_tokens, obs.completion_tokens) == ("success", 4, 9)
    assert obs.ttft_ms == pytest.approx(100.0)
    assert obs.latency_ms == pytest.approx(300.0)


async def test_dispatcher_client_going_away_is_observed_as_cancelled_not_failed(
    h: Harness, stream: bool
) -> None:
    h.adapter.scripts = {"a": [Hang()]}

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, h, plan(cand("a"), cand("b")), stream)
        await h.adapter.entered.wait()
        tg.cancel_scope.cancel()

    assert h.adapter.calls == ["a"]
    (obs,) = (await h.heard.drain()).observations()
    assert (obs.endpoint, obs.outcome, obs.error_kind) == ("a", "cancelled", "")
    assert obs.status is None  # no answer came (its row said 200)
    if stream:
        assert h.adapter.closed == ["a"]


@pytest.mark.parametrize(
    ("script", "raised", "outcome", "kind"),
    [
        (Bug(), KeyError, "cancelled", "internal"),
        (Refuse(), InvalidRequestError, "client_error", "invalid_request"),
    ],
    ids=["gateway-bug", "client-refused"],
)
async def test_an_attempt_ended_by_an_error_no_upstream_gave_is_observed_not_held_against_it(
    h: Harness, stream: bool, script: Script, raised: type[Exception], outcome: str, kind: str
) -> None:
    # It raised past the attempt: not observed (the model's prefill and probe leases, which
    # the observation gives back, were held until they expired), a stream left open.
    h.adapter.scripts = {"a": [script]}

    with pytest.raises(raised):
        await serve(h, plan(cand("a"), cand("b")), stream)

    assert h.adapter.calls == ["a"]  # not failed over: the client gets a 500, or its 400
    (obs,) = (await h.heard.drain()).observations()
    assert (obs.endpoint, obs.outcome, obs.error_kind) == ("a", outcome, kind)
    if stream:
        assert h.adapter.closed == ["a"]


async def test_dispatcher_hands_the_adapter_the_candidates_credential_and_limits(
    h: Harness,
) -> None:
    h.targets = FixedTargets(ttft=7.0, idle=9.0)

    await h.call(plan(cand("a", credential_id="k-1")))

    (target,) = h.adapter.targets
    assert (target.api_key, target.ttft_timeout, target.idle_timeout) == ("sk-a", 7.0, 9.0)
    assert "sk-a" not in repr(target)
