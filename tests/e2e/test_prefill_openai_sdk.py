"""Prefill-aware selection through the real server with the openai SDK, each knob set by the
spec's environment variable: the power-of-two-choices tie-break engaging only at
``ROUTING_PREFILL_INTERVENE_TOKENS``, the lease ending at the first token or when a stream is
abandoned before it, elephants spreading (``..._ELEPHANT_TOKENS`` / ``..._ELEPHANT_LIMIT``), the
un-cached estimate from the caller's last completed prompt (``..._HINT_TTL_SEC``), the affinity
ceiling and the kill switch (``ROUTING_PREFILL_AWARE_ENABLED=0``).

The gateway estimates a prompt at one token per four body bytes, so a 4000-character message
is a ~1000-token prompt; held on a hanging upstream it is prefill backlog. Runs on
``inproc://`` and on NATS (``bus_url``).
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any

import pytest

from schemas import Observation, subjects
from tests.e2e.conftest import CHAT, STAYS_OPEN, SkewedClock, config, eid, model, route, watch
from tests.fixtures.upstream import FakeUpstream, Hang, Stream, UpstreamFactory

if TYPE_CHECKING:
    import httpx
    import openai

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

ADMIN = "adm-prefill"
ADMIN_AUTH = {"authorization": f"Bearer {ADMIN}"}
BIG = "x" * 4000  # ~1000 tokens as the gateway estimates them
N = 200  # small requests per measured share


def _config(a: FakeUpstream, b: FakeUpstream, *, affinity: bool = False) -> dict[str, Any]:
    """``a`` is the favourite (1 : 1e-9) until an admin evens the weights."""
    return config(
        model("m", route(a, 1), route(b, 1e-9)),
        circuit=STAYS_OPEN,
        routing={"trust_proxy_headers": True, "affinity": {"enabled": affinity}},
        admin_key=ADMIN,
    )


def _body(content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


async def _weight(gw: RunningGateway, up: FakeUpstream, weight: float) -> None:
    resp = await gw.http().put(
        f"/admin/routing/weights/m/{eid('m', up)}", json={"weight": weight}, headers=ADMIN_AUTH
    )
    assert resp.status_code == 200, resp.text


def _hold(gw: RunningGateway, ip: str, content: str = BIG) -> asyncio.Task[httpx.Response]:
    """Send a request from ``ip`` that the test lets hang on its upstream."""
    return asyncio.create_task(
        gw.http().post(CHAT, json=_body(content), headers={"x-forwarded-for": ip})
    )


async def _via(gw: RunningGateway, ip: str, content: str = "hi") -> str:
    resp = await gw.http().post(CHAT, json=_body(content), headers={"x-forwarded-for": ip})
    assert resp.status_code == 200, resp.text
    return str(resp.headers["x-routed-via"])


async def _share(client: openai.AsyncOpenAI, up: FakeUpstream) -> int:
    """How many of :data:`N` small requests (8 at a time) ``up`` served."""
    gate = asyncio.Semaphore(8)

    async def one() -> str:
        async with gate:
            raw = await client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
            return str(raw.headers["x-routed-via"])

    vias = await asyncio.gather(*(one() for _ in range(N)))
    return sum(v == eid("m", up) for v in vias)


def _near(count: int, p: float) -> bool:
    """``count`` of :data:`N` is within 4.5 sigma of ``N * p`` (a false failure ~1 in 150,000)."""
    return abs(count - N * p) <= 4.5 * math.sqrt(N * p * (1 - p))


# Two equal routes, one holding ~1000 tokens of prefill. Two draws differ half the time; when
# the tie-break engages, the lighter one wins them all: the loaded one keeps 1/4 of the traffic.
ENGAGED, PLAIN = 0.25, 0.5


@pytest.mark.parametrize(
    ("intervene", "share"),
    [(500, ENGAGED), (5000, PLAIN)],
    ids=["backlog_above_threshold", "backlog_below_threshold"],
)
async def test_prefill_tiebreak_steers_from_a_backlog_only_once_it_reaches_intervene_tokens(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    monkeypatch: pytest.MonkeyPatch,
    intervene: int,
    share: float,
) -> None:
    monkeypatch.setenv("ROUTING_PREFILL_INTERVENE_TOKENS", str(intervene))
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(_config(a, b))
    a.enqueue(Hang())
    held = _hold(gw, "10.0.0.9")
    await a.wait_for_requests(1)
    await _weight(gw, b, 1)

    got = await _share(gw.openai(), a)

    assert _near(got, share), (got, N)
    held.cancel()


async def test_prefill_lease_ends_at_the_first_token_and_when_its_stream_is_abandoned(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ROUTING_PREFILL_INTERVENE_TOKENS", "500")
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(_config(a, b))
    client = gw.openai()
    big = [{"role": "user", "content": BIG}]

    # A big stream reaches its first token, then decodes forever: no prefill pressure.
    a.enqueue(Stream(stall_after=1))
    decoding = await client.chat.completions.create(model="m", messages=big, stream=True)
    await anext(aiter(decoding))
    await _weight(gw, b, 1)
    after_first_token = await _share(client, a)

    # A big stream still waiting for its first byte is pressure until its client leaves.
    await _weight(gw, b, 1e-9)
    a.enqueue(Hang())
    seen = len(a.requests)
    waiting = asyncio.create_task(
        client.chat.completions.create(model="m", messages=big, stream=True)
    )
    await a.wait_for_requests(seen + 1)
    await _weight(gw, b, 1)
    before_first_token = await _share(client, a)
    async with watch(gw, subjects.observation(eid("m", a))) as observations:
        waiting.cancel()
        await observations.next(Observation, lambda o: o.outcome == "cancelled")
    after_abandon = await _share(client, a)

    assert _near(after_first_token, PLAIN), after_first_token
    assert _near(before_first_token, ENGAGED), before_first_token
    assert _near(after_abandon, PLAIN), after_abandon
    await decoding.close()


@pytest.mark.parametrize(
    ("enabled", "expected"),
    [
        (None, "aabba"),  # a holds 2 elephants, then b does; then nobody has room: weights decide
        ("0", "aaaaa"),  # the kill switch: a plain weighted draw
    ],
    ids=["enabled", "disabled_by_env"],
)
async def test_prefill_elephants_spread_past_the_elephant_limit_and_never_go_unrouted(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    monkeypatch: pytest.MonkeyPatch,
    enabled: str | None,
    expected: str,
) -> None:
    monkeypatch.setenv("ROUTING_PREFILL_ELEPHANT_TOKENS", "500")
    monkeypatch.setenv("ROUTING_PREFILL_ELEPHANT_LIMIT", "2")
    if enabled is not None:
        monkeypatch.setenv("ROUTING_PREFILL_AWARE_ENABLED", enabled)
    a, b = await fake_upstreams("a", default=Hang()), await fake_upstreams("b", default=Hang())
    gw = await gateway_factory(_config(a, b))

    held, landed = [], ""
    for i in range(5):
        held.append(_hold(gw, f"10.0.0.{i}"))
        before = (len(a.requests), len(b.requests))
        await _arrival(a, b)
        landed += "a" if len(a.requests) > before[0] else "b"

    assert landed == expected
    for task in held:
        task.cancel()


async def _arrival(*ups: FakeUpstream) -> None:
    """Wait until one more request has arrived at any of ``ups``."""
    total = sum(len(up.requests) for up in ups)
    waits = [asyncio.create_task(up.wait_for_requests(len(up.requests) + 1)) for up in ups]
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED, timeout=10)
    for w in pending:
        w.cancel()
    assert done and sum(len(up.requests) for up in ups) == total + 1


async def test_prefill_uncached_estimate_uses_the_callers_last_prompt_there_until_the_hint_ttl(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    monkeypatch: pytest.MonkeyPatch,
    actor_clock: SkewedClock,
) -> None:
    monkeypatch.setenv("ROUTING_PREFILL_ELEPHANT_TOKENS", "500")
    monkeypatch.setenv("ROUTING_PREFILL_ELEPHANT_LIMIT", "1")
    monkeypatch.setenv("ROUTING_PREFILL_HINT_TTL_SEC", "60")
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(_config(a, b))
    warm = BIG + " and one more question"

    first = await _via(gw, "10.0.0.1", BIG)  # completes: X's last prompt on a is ~1000
    a.enqueue(Hang())
    elephant = _hold(gw, "10.0.0.3")  # a cold elephant holds a's only elephant slot
    await a.wait_for_requests(2)
    continuation = await _via(gw, "10.0.0.1", warm)  # ~6 un-cached tokens on a: no elephant
    cold = await _via(gw, "10.0.0.2", warm)  # the same prompt, cold: an elephant, a is full
    actor_clock.advance(61)
    forgotten = await _via(gw, "10.0.0.1", warm)  # the hint has lapsed: cold again

    assert (first, continuation) == (eid("m", a), eid("m", a))
    assert (cold, forgotten) == (eid("m", b), eid("m", b))
    elephant.cancel()


@pytest.mark.parametrize(
    ("ceiling", "stays"),
    [(500, False), (5000, True)],
    ids=["backlog_above_ceiling", "backlog_below_ceiling"],
)
async def test_prefill_backlog_above_the_affinity_ceiling_abandons_the_pin_and_repins(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    monkeypatch: pytest.MonkeyPatch,
    ceiling: int,
    stays: bool,
) -> None:
    monkeypatch.setenv("ROUTING_PREFILL_AFFINITY_CEILING", str(ceiling))
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(_config(a, b, affinity=True))
    pinned = await _via(gw, "10.0.0.1")
    a.enqueue(Hang())
    other = _hold(gw, "10.0.0.2")  # another caller's ~1000-token prompt in prefill on a
    await a.wait_for_requests(2)

    during = await _via(gw, "10.0.0.1")
    async with watch(gw, subjects.observation(eid("m", a))) as observations:
        other.cancel()
        await observations.next(Observation, lambda o: o.outcome == "cancelled")
    after = await _via(gw, "10.0.0.1")  # a's backlog is gone; only a pin keeps b

    assert pinned == eid("m", a)
    want = eid("m", a) if stays else eid("m", b)
    assert (during, after) == (want, want)
