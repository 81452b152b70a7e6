"""Endpoint health and circuit breaking, driven through the gateway with the openai SDK.

Breakers use a threshold of 2; the cooldown is long where the circuit must stay open and about
a second where a test waits for the half-open probe. Tests wait for the gateway's own events
(``llmgw.events.circuit``, ``llmgw.endpoint.<id>.state``) instead of sleeping. Runs on
``inproc://`` and on NATS (``bus_url``).
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING

import openai
import pytest

from schemas import CircuitTransition
from tests.e2e.conftest import (
    CHAT,
    HALF_OPEN_SOON,
    HI,
    STAYS_OPEN,
    assert_openai_error,
    chat,
    circuit_events,
    config,
    eid,
    endpoint_states,
    model,
    route,
)
from tests.fixtures.upstream import (
    Behaviour,
    FakeUpstream,
    Hang,
    Reply,
    Reset,
    Stream,
    UpstreamFactory,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    import httpx

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e


def _refused_url() -> str:
    """A loopback URL nobody listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


async def _post(gw: RunningGateway, **body: object) -> httpx.Response:
    return await gw.http().post(CHAT, json=chat("m", **body))


# -- what counts as the endpoint's failure ----------------------------------------------------

# upstream behaviour -> what the client sees while the circuit is still closed
ENDPOINT_FAILURES: dict[str, tuple[Behaviour, int]] = {
    "408": (Reply(408), 502),
    # A plain 429 is back-pressure, never the endpoint's failure (test_backpressure_...);
    # one that says the quota is spent still is.
    "quota_429": (Reply(429, body={"error": {"code": "insufficient_quota", "message": "q"}}), 429),
    "500": (Reply(500), 502),
    "503": (Reply(503), 502),
    "non_json_200": (Reply(200, body="<html>oops</html>"), 502),
    "garbage_json_200": (
        Reply(200, body="{not json", headers={"content-type": "application/json"}),
        502,
    ),
    "reset": (Reset(), 502),
    "timeout": (Hang(), 504),
}


@pytest.mark.parametrize(
    ("behaviour", "status"), ENDPOINT_FAILURES.values(), ids=ENDPOINT_FAILURES.keys()
)
async def test_breaker_after_threshold_endpoint_failures_opens_and_refuses_with_503(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    behaviour: Behaviour,
    status: int,
) -> None:
    fake_upstream.set_default(behaviour)
    # Only the timeout case needs a short limit; a loaded machine can take longer than that
    # to answer a fresh connection's first request.
    limit = 0.2 if status == 504 else 10.0
    gw = await gateway_factory(
        config(model("m", route(fake_upstream, timeout_seconds=limit)), circuit=STAYS_OPEN)
    )
    endpoint = eid("m", fake_upstream)

    async with circuit_events(gw) as events:
        first = await _post(gw)
        second = await _post(gw)
        opened = await events.circuit("open", endpoint)
    refused = await _post(gw)

    assert_openai_error(first, status)
    assert_openai_error(second, status)
    assert "2 consecutive failures" in opened.reason
    err = assert_openai_error(refused, 503, "all_circuits_open")
    assert "circuits open" in err["message"]
    assert refused.headers["retry-after"] in ("29", "30")
    assert len(fake_upstream.requests) == 2


async def test_breaker_counts_a_refused_connection_as_a_failure(
    gateway_factory: GatewayFactory,
) -> None:
    cfg = config(
        model("m", {"kind": "openai_compat", "base_url": _refused_url()}), circuit=STAYS_OPEN
    )
    gw = await gateway_factory(cfg)
    endpoint = gw.config.models[0].endpoint_ids()[0]

    async with circuit_events(gw) as events:
        first, second = await _post(gw), await _post(gw)
        await events.circuit("open", endpoint)
    refused = await _post(gw)

    assert_openai_error(first, 502)
    assert_openai_error(second, 502)
    assert_openai_error(refused, 503, "all_circuits_open")


CLIENT_ERRORS = (400, 403, 404, 413, 422)


@pytest.mark.parametrize("status", CLIENT_ERRORS)
async def test_breaker_does_not_count_upstream_4xx_request_errors(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    status: int,
) -> None:
    fake_upstream.set_default(Reply(status))
    gw = await gateway_factory(config(model("m", route(fake_upstream))))
    endpoint = eid("m", fake_upstream)

    async with endpoint_states(gw, endpoint) as states:
        answers = [await _post(gw) for _ in range(5)]
        # A barrier: one real failure after the five 4xx. Observations of one endpoint are
        # handled in order, so this state includes whatever the 4xx did.
        fake_upstream.set_default(Reply(500))
        await _post(gw)
        state = await states.state(lambda s: s.consecutive_failures > 0)

    expected = status if status in (400, 404, 413, 422) else 502
    for resp in answers:
        assert resp.status_code == expected, resp.text
    assert (state.circuit_state, state.consecutive_failures) == ("closed", 1)
    assert state.availability == pytest.approx(0.9)  # only the 500 fed the EWMA


async def test_breaker_threshold_comes_from_circuit_failure_threshold_env(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CIRCUIT_FAILURE_THRESHOLD", "1")
    fake_upstream.set_default(Reply(500))
    gw = await gateway_factory(
        config(
            model("m", route(fake_upstream)),
            circuit={"failure_threshold": 5, "cooldown_seconds": 30},
        )
    )

    async with circuit_events(gw) as events:
        await _post(gw)
        opened = await events.circuit("open")

    assert opened.reason == "1 consecutive failures"
    assert_openai_error(await _post(gw), 503, "all_circuits_open")


# -- the breaker's life cycle -----------------------------------------------------------------


async def test_circuit_transitions_are_published_open_half_open_closed_in_order(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    gw = await gateway_factory(config(model("m", route(fake_upstream)), circuit=HALF_OPEN_SOON))
    endpoint = eid("m", fake_upstream)
    fake_upstream.enqueue(Reply(500), Reply(500))

    async with circuit_events(gw) as events:
        await _post(gw)
        await _post(gw)
        await events.circuit("open")
        await events.circuit("half_open")
        probe = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=HI)
        await events.circuit("closed")

    transitions = [m for m in events.seen if isinstance(m, CircuitTransition)]
    assert [(t.endpoint, t.old, t.new) for t in transitions] == [
        (endpoint, "closed", "open"),
        (endpoint, "open", "half_open"),
        (endpoint, "half_open", "closed"),
    ]
    assert probe.headers["x-routed-via"] == endpoint
    answer = await gw.openai().chat.completions.create(model="m", messages=HI)
    assert answer.choices[0].message.content == "Hello from up1."
    assert len(fake_upstream.requests) == 4


async def test_half_open_admits_one_probe_and_a_failed_probe_reopens(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    gw = await gateway_factory(config(model("m", route(fake_upstream)), circuit=HALF_OPEN_SOON))
    fake_upstream.set_default(Reply(500))

    async with circuit_events(gw) as events:
        await _post(gw)
        await _post(gw)
        await events.circuit("open")
        await events.circuit("half_open")
        probe = await _post(gw)
        reopened = await events.circuit("open")

    assert probe.status_code == 502
    assert (reopened.old, reopened.reason) == ("half_open", "probe failed")
    assert len(fake_upstream.requests) == 3


async def test_half_open_probe_in_flight_refuses_everyone_else(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    # The probe is ended by its client (its deadline, the route's timeout, is far away).
    gw = await gateway_factory(
        config(
            model("m", route(fake_upstream)),
            circuit={"failure_threshold": 2, "cooldown_seconds": 2.0},
        )
    )
    fake_upstream.enqueue(Reply(500), Reply(500), Hang())
    client = gw.openai()

    async with circuit_events(gw) as events:
        await _post(gw)
        await _post(gw)
        await events.circuit("open")
        await events.circuit("half_open")
        probe = asyncio.create_task(client.chat.completions.create(model="m", messages=HI))
        await fake_upstream.wait_for_requests(3)
        others = await asyncio.gather(*(_post(gw) for _ in range(8)))

        # The probe's client gives up: the probe is abandoned, never wedging half-open.
        probe.cancel()
        await fake_upstream.wait_for_disconnects(1)
        reopened = await events.circuit("open")

    for resp in others:
        assert_openai_error(resp, 503, "all_circuits_open")
        assert int(resp.headers["retry-after"]) >= 1
    assert len(fake_upstream.requests) == 3
    assert reopened.old == "half_open" and "abandoned" in reopened.reason
    with pytest.raises(asyncio.CancelledError):
        await probe


async def test_all_circuits_open_answers_503_with_retry_after_until_the_probe(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a = await fake_upstreams("a")
    b = await fake_upstreams("b")
    a.set_default(Reply(500))
    b.set_default(Reply(503))
    gw = await gateway_factory(
        config(
            model("m", route(a, 1), route(b, 1)),
            circuit={"failure_threshold": 1, "cooldown_seconds": 30},
        )
    )

    async with circuit_events(gw) as events:
        first = await _post(gw)  # one attempt on each route, each opens
        await events.circuit("open", eid("m", a))
        await events.circuit("open", eid("m", b))

    with pytest.raises(openai.APIStatusError) as exc:
        await gw.openai().chat.completions.create(model="m", messages=HI)

    assert first.status_code == 502
    refused = exc.value.response
    assert_openai_error(refused, 503, "all_circuits_open")
    assert int(refused.headers["retry-after"]) in (29, 30)
    deep = (await gw.http().get("/health/deep")).json()["endpoints"]
    assert {e["circuit_state"] for e in deep.values()} == {"open"}
    assert (len(a.requests), len(b.requests)) == (1, 1)


async def test_open_circuit_is_skipped_and_traffic_goes_to_the_other_route(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a = await fake_upstreams("a")
    b = await fake_upstreams("b")
    a.set_default(Reply(500))
    gw = await gateway_factory(
        config(
            model("m", route(a, 1), route(b, 1e-6)),
            circuit={"failure_threshold": 1, "cooldown_seconds": 30},
        )
    )

    async with circuit_events(gw) as events:
        failed_over = await gw.openai().chat.completions.with_raw_response.create(
            model="m", messages=HI
        )
        await events.circuit("open", eid("m", a))
    vias = [
        (
            await gw.openai().chat.completions.with_raw_response.create(model="m", messages=HI)
        ).headers["x-routed-via"]
        for _ in range(5)
    ]

    assert failed_over.headers["x-routed-via"] == eid("m", b)
    assert vias == [eid("m", b)] * 5
    assert len(a.requests) == 1


# -- streams and disconnects ------------------------------------------------------------------


async def _stream_and_hang_up_after_first_chunk(
    client: openai.AsyncOpenAI, up: FakeUpstream
) -> None:
    up.enqueue(Stream(stall_after=1))
    stream = await client.chat.completions.create(model="m", messages=HI, stream=True)
    first = await anext(aiter(stream))
    assert first.choices[0].delta.role == "assistant"
    await stream.close()


async def _cancel_while_upstream_hangs(
    client: openai.AsyncOpenAI, up: FakeUpstream, stream: bool
) -> None:
    up.enqueue(Hang())
    call = asyncio.create_task(
        client.chat.completions.create(model="m", messages=HI, stream=stream)
    )
    await up.wait_for_requests(1)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call


HANG_UPS = {
    "stream_after_first_chunk": _stream_and_hang_up_after_first_chunk,
    "stream_before_first_byte": lambda c, up: _cancel_while_upstream_hangs(c, up, True),
    "non_streaming": lambda c, up: _cancel_while_upstream_hangs(c, up, False),
}


@pytest.mark.parametrize("hang_up", HANG_UPS.values(), ids=HANG_UPS.keys())
async def test_client_disconnect_cancels_the_upstream_call_and_is_not_a_failure(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    hang_up: Callable[[openai.AsyncOpenAI, FakeUpstream], Awaitable[None]],
) -> None:
    gw = await gateway_factory(config(model("m", route(fake_upstream))))

    await hang_up(gw.openai(), fake_upstream)
    await fake_upstream.wait_for_disconnects(1)
    async with endpoint_states(gw, eid("m", fake_upstream)) as states:
        fake_upstream.enqueue(Reply(500))
        await _post(gw)  # barrier: observations of one endpoint are handled in order
        state = await states.state(lambda s: s.consecutive_failures > 0)

    assert (state.circuit_state, state.consecutive_failures) == ("closed", 1)
    assert state.availability == pytest.approx(0.9)  # the hang-up did not feed the EWMA


async def test_stream_cut_mid_answer_counts_against_the_endpoint(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    gw = await gateway_factory(config(model("m", route(fake_upstream))))
    endpoint = eid("m", fake_upstream)
    fake_upstream.enqueue(Stream(cut_after=1), Stream(cut_after=2))

    async with circuit_events(gw) as events:
        for _ in range(2):
            async with gw.http().stream("POST", CHAT, json=chat("m", stream=True)) as resp:
                body = (await resp.aread()).decode()
            assert resp.status_code == 200
            assert '"error"' in body and "[DONE]" not in body
        opened = await events.circuit("open", endpoint)

    assert "2 consecutive failures" in opened.reason
