"""The failover loop through the real server with the openai SDK: the hop cap, the wall-clock
budget (the first retry still runs past it; no retry starts after it), the time-to-first-token
and inter-chunk idle timeouts, and a client that goes away counted against nothing.

Upstreams are scripted fakes; timings are short settings (budget 0.3 s, TTFT and idle 0.3 s).
These tests prove the behaviour end to end (which route served, what was observed); the
timing itself (budget arithmetic, which limit bounds an attempt) is pinned on an injected
clock in tests/unit/gateway/ingress/test_dispatcher.py, not by measuring elapsed time here.
Routes are declared primary first (weight 1) with fallbacks of weight 1e-6, so the draw picks
the primary except with odds of about one in a million, and fallbacks follow declaration
order. Tests wait on upstream requests and the gateway's own bus, never on sleeps. Runs on
``inproc://`` and on NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import openai
import pytest

from schemas import KeyMuted, Observation, subjects
from schemas.config import credential_id
from tests.e2e.conftest import HI, config, eid, endpoint_states, model, route, watch
from tests.fixtures.upstream import (
    FakeUpstream,
    Hang,
    Reply,
    Stream,
    UpstreamFactory,
    split_text,
)

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

# Breakers and benches that never trip unless a test says so: these tests are about the loop.
CALM = {"failure_threshold": 100, "cooldown_seconds": 30}
NO_BENCH = {"failures": 100}
TINY = 1e-6


def fallback(up: FakeUpstream, **extra: Any) -> dict[str, Any]:
    """A route to ``up`` that the draw (almost) never picks first."""
    return route(up, TINY, **extra)


def failover(**failover_settings: Any) -> dict[str, Any]:
    return {"bench": NO_BENCH, "failover": failover_settings}


async def _stream_text(client: openai.AsyncOpenAI) -> tuple[str, str]:
    """Stream one completion; (text, x-routed-via)."""
    raw = await client.chat.completions.with_raw_response.create(
        model="m", messages=HI, stream=True
    )
    text = ""
    async for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return text, str(raw.headers["x-routed-via"])


# -- the hop cap ----------------------------------------------------------------------------


@pytest.mark.parametrize(("cap", "routes"), [(3, 5), (None, 22)], ids=["3", "default_20"])
async def test_failover_hop_cap_stops_after_max_attempts_with_routes_left(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    cap: int | None,
    routes: int,
) -> None:
    fake_upstream.set_default(Reply(500))
    # Routes of one upstream, told apart by the model each asks for.
    declared = [
        route(fake_upstream, 1.0 if i == 0 else TINY, provider_model_id=f"r{i}")
        for i in range(routes)
    ]
    settings = failover() if cap is None else failover(max_attempts=cap)
    gw = await gateway_factory(config(model("m", *declared), circuit=CALM, routing=settings))
    expected = cap or 20

    async with watch(gw, subjects.OBSERVATION_ANY) as obs:
        with pytest.raises(openai.InternalServerError) as err:
            await gw.openai().chat.completions.create(model="m", messages=HI)
        seen = [await obs.next(Observation) for _ in range(expected)]

    assert err.value.status_code == 502
    assert [r.model for r in fake_upstream.requests] == [f"r{i}" for i in range(expected)]
    assert [(o.attempt, o.outcome) for o in seen] == [
        (n, "failure") for n in range(1, expected + 1)
    ]


# -- the wall-clock budget ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
async def test_failover_budget_cancels_a_silent_first_attempt_and_the_first_retry_runs_past_it(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    stream: bool,
) -> None:
    a, b, c = await fake_upstreams("a"), await fake_upstreams("b"), await fake_upstreams("c")
    a.set_default(Hang())
    # The first retry answers well after the budget ran out; it is not cut short.
    b.set_default(Stream(first_byte_delay=0.5) if stream else Reply(delay=0.5))
    gw = await gateway_factory(
        config(
            model(
                "m",
                route(a, ttft_timeout_seconds=30),
                fallback(b, ttft_timeout_seconds=30),
                fallback(c),
            ),
            circuit=CALM,
            routing=failover(budget_seconds=0.3),
        )
    )
    client = gw.openai()

    async with watch(gw, subjects.OBSERVATION_ANY) as obs:
        if stream:
            text, via = await _stream_text(client)
        else:
            raw = await client.chat.completions.with_raw_response.create(model="m", messages=HI)
            text, via = raw.parse().choices[0].message.content or "", raw.headers["x-routed-via"]
        cut = await obs.next(Observation, lambda o: o.endpoint == eid("m", a))
        served = await obs.next(Observation, lambda o: o.endpoint == eid("m", b))
    await a.wait_for_disconnects(1)

    assert (text, via) == ("Hello from b.", eid("m", b))
    assert (cut.attempt, cut.outcome, cut.error_kind) == (1, "cancelled", "budget")
    assert (served.attempt, served.outcome) == (2, "success")
    assert len(c.requests) == 0


async def test_failover_after_the_budget_ran_out_starts_no_further_retry(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c = await fake_upstreams("a"), await fake_upstreams("b"), await fake_upstreams("c")
    a.set_default(Reply(500))
    b.set_default(Reply(503, delay=0.5))  # the first retry ends after the 0.3 s budget
    gw = await gateway_factory(
        config(
            model("m", route(a), fallback(b), fallback(c)),
            circuit=CALM,
            routing=failover(budget_seconds=0.3),
        )
    )

    with pytest.raises(openai.InternalServerError) as err:
        await gw.openai().chat.completions.create(model="m", messages=HI)

    assert err.value.status_code == 502  # the primary's error
    assert (len(a.requests), len(b.requests), len(c.requests)) == (1, 1, 0)


async def test_failover_budget_zero_disables_it(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c = await fake_upstreams("a"), await fake_upstreams("b"), await fake_upstreams("c")
    a.set_default(Reply(500))
    b.set_default(Reply(503, delay=0.3))
    gw = await gateway_factory(
        config(
            model("m", route(a), fallback(b), fallback(c)),
            circuit=CALM,
            routing=failover(budget_seconds=0),
        )
    )

    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=HI)

    assert raw.headers["x-routed-via"] == eid("m", c)


# -- time to first token and idle -----------------------------------------------------------


async def test_stream_silent_before_its_first_byte_fails_over_at_the_ttft_timeout(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    a.set_default(Hang())
    gw = await gateway_factory(
        config(
            model("m", route(a, ttft_timeout_seconds=0.3), fallback(b)),
            circuit=CALM,
            routing=failover(),
        )
    )

    async with (
        watch(gw, subjects.OBSERVATION_ANY) as obs,
        endpoint_states(gw, eid("m", a)) as states,
    ):
        text, via = await _stream_text(gw.openai())
        timed_out = await obs.next(Observation, lambda o: o.endpoint == eid("m", a))
        charged = await states.state(lambda s: s.consecutive_failures > 0)
    await a.wait_for_disconnects(1)

    assert (text, via) == ("Hello from b.", eid("m", b))
    assert (timed_out.outcome, timed_out.error_kind) == ("failure", "ttft")
    assert charged.consecutive_failures == 1


async def _keep_alive_only(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, done: asyncio.Event
) -> None:
    """An SSE upstream that sends its headers and ``: keep-alive`` comments, never an event."""
    await reader.readuntil(b"\r\n\r\n")  # the body is never read: the answer never comes
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    writer.write(head + b"transfer-encoding: chunked\r\n\r\n")
    comment = b": keep-alive\n\n"
    try:
        while not done.is_set():
            writer.write(b"%x\r\n%s\r\n" % (len(comment), comment))
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.05)
    except ConnectionError:
        pass  # the gateway gave up on it
    finally:
        writer.close()


async def test_stream_of_only_comments_times_out_before_its_first_event_not_byte(
    gateway_factory: GatewayFactory,
) -> None:
    done = asyncio.Event()
    server = await asyncio.start_server(lambda r, w: _keep_alive_only(r, w, done), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    comments = {
        "kind": "openai_compat",
        "base_url": f"http://127.0.0.1:{port}/v1",
        "provider_model_id": "comments-model",
        "ttft_timeout_seconds": 0.3,
    }
    try:
        gw = await gateway_factory(config(model("m", comments), circuit=CALM, routing=failover()))
        with pytest.raises(openai.APIStatusError) as failed:
            await _stream_text(gw.openai())
    finally:
        done.set()
        server.close()
        await server.wait_closed()

    assert failed.value.status_code == 504
    message = failed.value.body["message"]  # type: ignore[index]
    # Bytes came (headers, comments): what never came is an event.
    assert "timed out before its stream's first event: none in 0.3 s" in message, message
    assert "first byte" not in message


async def test_stream_silent_after_its_first_chunk_ends_with_an_error_event_at_idle_timeout(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a", chunks=4), await fake_upstreams("b")
    a.set_default(Stream(stall_after=1))
    gw = await gateway_factory(
        config(
            model("m", route(a, idle_timeout_seconds=0.3), fallback(b)),
            circuit=CALM,
            routing=failover(),
        )
    )
    received: list[str] = []

    async with (
        watch(gw, subjects.OBSERVATION_ANY) as obs,
        endpoint_states(gw, eid("m", a)) as states,
    ):
        stream = await gw.openai().chat.completions.create(model="m", messages=HI, stream=True)
        with pytest.raises(openai.APIError) as err:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    received.append(chunk.choices[0].delta.content)
        stalled = await obs.next(Observation, lambda o: o.endpoint == eid("m", a))
        charged = await states.state(lambda s: s.consecutive_failures > 0)
    await a.wait_for_disconnects(1)

    assert received == split_text(a.text, 4)[:1]  # committed: no fallback once content is out
    assert "stalled" in err.value.message
    assert (stalled.outcome, stalled.error_kind) == ("failure", "idle")
    assert charged.consecutive_failures == 1
    assert len(b.requests) == 0


# -- a client that goes away ----------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
async def test_client_cancel_records_nothing_against_endpoint_model_or_credential(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    stream: bool,
) -> None:
    k1, k2 = "sk-first", "sk-second"
    up = fake_upstream
    up.enqueue(Stream(stall_after=1) if stream else Hang(), Reply(500))
    # One more failure than each of these would trip on if the cancel counted.
    gw = await gateway_factory(
        config(
            model("m", route(up, api_keys=[k1, k2])),
            circuit={"failure_threshold": 2, "cooldown_seconds": 30},
            routing={
                "bench": {"failures": 2, "model_breaker_failures": 2},
                "key_pool": {"mute_seconds": 30},
            },
        )
    )
    endpoint = eid("m", up)
    client = gw.openai()

    async with (
        watch(gw, subjects.OBSERVATION_ANY) as obs,
        watch(gw, subjects.event("keypool")) as keys,
        endpoint_states(gw, endpoint) as states,
    ):
        if stream:
            s = await client.chat.completions.create(model="m", messages=HI, stream=True)
            async for _ in s:
                break  # the first chunk is in: go away mid-stream
            await s.close()
        else:
            task = asyncio.create_task(client.chat.completions.create(model="m", messages=HI))
            await up.wait_for_requests(1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        cancelled = await obs.next(Observation)
        await up.wait_for_disconnects(1)
        # A barrier: one real failure. Observations of one endpoint are handled in order, so
        # what follows it includes whatever the cancel did.
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="m", messages=HI)
        state = await states.state(lambda s: s.consecutive_failures > 0)
        muted = await keys.next(KeyMuted)
        served = await client.chat.completions.create(model="m", messages=HI)

    assert (cancelled.outcome, cancelled.error_kind) == ("cancelled", "")
    assert (state.circuit_state, state.consecutive_failures, state.benched_until) == (
        "closed",
        1,
        None,
    )
    assert state.availability == pytest.approx(0.9)  # only the 500 fed the EWMA
    assert (muted.credential_id, muted.status) == (credential_id(k1), 500)
    assert served.choices[0].message.content == "Hello from up1."
    assert [r.credential for r in up.requests[:2]] == [k1, k1]  # the cancel muted nothing
