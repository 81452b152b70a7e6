"""Degraded mode through the real server with the openai SDK: entry after the ratio of
healthy routes stays under the threshold for the entry period, selection in configured order
while degraded, exit after the longer exit period, no flapping on a short dip, and ``/health``
and ``/health/deep`` reporting the mode and when it was entered.

Routes are made unhealthy by the model bench (one failure benches; the background probe
re-validates every 0.1 s), so they recover when their upstream does, without client traffic.
Short settings: health pass every 0.05 s, entry 0.3 s, exit 0.5 s. Tests wait on
``llmgw.events.mode`` and ``llmgw.events.bench``, never on sleeps. Runs on ``inproc://`` and
on NATS.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import anyio
import openai
import pytest

from schemas import BenchChanged, ModeChanged, subjects
from tests.e2e.conftest import HI, WAIT, Watch, circuit_events, config, eid, model, route, watch
from tests.fixtures.upstream import FakeUpstream, Reply, UpstreamFactory

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

ADMIN = "sk-admin-degraded"
ENTRY, EXIT = 0.3, 0.5
# The flapping test's entry period outlasts a bench (1 s, below): a dip whose probes succeed
# ends by the bench's own end however late a loaded machine runs them, so it can never enter.
# At 0.3 s a CI run's dip outlasted it (its probe answered late) and entered before the
# outage began. (Not for every test: one whose circuits half-open in 1 s needs the short one.)
DIP_PROOF_ENTRY = 1.5
PASS = 0.05  # the health pass interval: the mode sees the ratio only at passes
DEGRADED = {
    "threshold": 0.5,
    "entry_seconds": ENTRY,
    "exit_seconds": EXIT,
    "pass_interval_seconds": PASS,
}
CALM = {"failure_threshold": 100, "cooldown_seconds": 30}
BENCH = {"failures": 1, "duration_seconds": 1.0, "probe_after_fraction": 0.1}
ROUTING = {
    "affinity": {"enabled": False},  # one test client is one caller: no pin to follow
    "bench": BENCH,
    "degraded": DEGRADED,
}


async def _bench_all(
    gw: RunningGateway, benches: Watch, flaky: list[FakeUpstream]
) -> list[BenchChanged]:
    """Fail one pinned request on each of ``flaky`` at once; their bench events."""
    admin = gw.openai(api_key=ADMIN)

    async def fail(up: FakeUpstream) -> None:
        with pytest.raises(openai.InternalServerError):
            await admin.chat.completions.create(
                model="m", messages=HI, extra_headers={"X-Route-Pin": eid("m", up)}
            )

    await asyncio.gather(*(fail(up) for up in flaky))
    return [
        await benches.next(
            BenchChanged,
            lambda e, up=up: (  # type: ignore[misc]
                e.endpoint == eid("m", up) and e.benched
            ),
        )
        for up in flaky
    ]


async def test_degraded_mode_enters_and_exits_after_their_periods_without_flapping(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    flaky = [await fake_upstreams(n) for n in ("p", "q", "r")]
    first, preferred = await fake_upstreams("s"), await fake_upstreams("t")
    # Declared order p q r s t; the draw almost never picks s. Benches of 3 s, probed after
    # 0.3: a probe a loaded machine runs late renews its bench before it lapses (with 1 s,
    # one more than 0.9 s late let its route count healthy for a moment, the ratio rose
    # over the threshold and the entry period began again: CI waited 10 s for no entry).
    bench = {**BENCH, "duration_seconds": 3.0}
    gw = await gateway_factory(
        config(
            model("m", *(route(up) for up in flaky), route(first, 1e-6), route(preferred)),
            circuit=CALM,
            routing={
                **ROUTING,
                "bench": bench,
                "degraded": {**DEGRADED, "entry_seconds": DIP_PROOF_ENTRY},
            },
            admin_key=ADMIN,
        )
    )
    http = gw.http()
    client = gw.openai()
    started = (await http.get("/health")).json()

    async with (
        watch(gw, subjects.event("mode")) as modes,
        watch(gw, subjects.event("bench")) as benches,
    ):
        # A dip shorter than the entry period: the probes succeed at once.
        for up in flaky:
            up.enqueue(Reply(500))
        await _bench_all(gw, benches, flaky)
        for up in flaky:
            await benches.next(
                BenchChanged,
                lambda e, up=up: (  # type: ignore[misc]
                    e.endpoint == eid("m", up) and not e.benched
                ),
            )
        # The mode sees the ratio only at its passes: let one see the dip is over.
        with anyio.fail_after(WAIT):
            while (await http.get("/health")).json()["healthy_ratio"] < 1:
                pass
        # Now a real outage: the probes keep failing.
        outage_began = time.time()
        for up in flaky:
            up.set_default(Reply(500))
        outage = await _bench_all(gw, benches, flaky)
        entered = await modes.next(ModeChanged)
        health, deep = (await http.get("/health")).json(), (await http.get("/health/deep")).json()
        while_degraded = [
            (
                await client.chat.completions.with_raw_response.create(model="m", messages=HI)
            ).headers["x-routed-via"]
            for _ in range(5)
        ]
        # Recovery: the next probes succeed and lift every bench.
        recovery_began = time.time()
        for up in flaky:
            up.set_default(Reply())
        lifts = [
            await benches.next(
                BenchChanged,
                lambda e, up=up: (  # type: ignore[misc]
                    e.endpoint == eid("m", up) and not e.benched
                ),
            )
            for up in flaky
        ]
        left = await modes.next(ModeChanged)
        after = (await http.get("/health")).json()
        explored = {
            (
                await client.chat.completions.with_raw_response.create(model="m", messages=HI)
            ).headers["x-routed-via"]
            for _ in range(8)
        }

    assert (started["mode"], after["mode"]) == ("normal", "normal")
    # The dip changed nothing; the outage entered once it had lasted the entry period.
    assert entered.mode == "degraded"
    # Against when the failures began, not the bench events' stamps: on a busy machine an
    # endpoint's event is stamped after its state has already reached the mode's owner.
    assert entered.since >= outage_began + DIP_PROOF_ENTRY
    assert len(outage) == len(flaky)
    assert entered.ratio == pytest.approx(0.4)
    assert (health["mode"], health["mode_since"]) == ("degraded", entered.since)
    assert (deep["status"], deep["mode"], deep["mode_since"]) == (
        "degraded",
        "degraded",
        entered.since,
    )
    # While degraded: no exploration, the configured order of what remains (s before t).
    assert while_degraded == [eid("m", first)] * 5
    # Exit only once the ratio (3 of 5 from the first lift) held for the longer exit period.
    assert left.mode == "normal"
    # Against when recovery began, as the entry: a lift reaches the mode's owner before its
    # bench event is stamped (the stamp read 0.1 ms after the exit once). Or earlier, when a
    # route's last bench ended before the recovery: it counts as healthy from then, before a
    # probe lifts it (a loaded machine ran its next probe late; the exit came 7 ms before
    # recovery_began + EXIT once).
    last_until = {
        e.endpoint: e.until
        for e in benches.seen
        if isinstance(e, BenchChanged) and e.benched and e.until is not None
    }
    assert left.since >= min(recovery_began, *last_until.values()) + EXIT
    assert len(lifts) == len(flaky)
    assert after["mode_since"] == left.since
    assert [m.mode for m in modes.seen if isinstance(m, ModeChanged)] == ["degraded", "normal"]
    # Back to the weighted draw over all five: configured order would send all 8 to p.
    assert len(explored) > 1  # all 8 on one route of four equal weights: odds ~1e-5


async def test_degraded_mode_routes_whose_circuit_opened_come_back_and_the_mode_ends(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    flaky = [await fake_upstreams(n) for n in ("p", "q", "r")]
    healthy = [await fake_upstreams(n) for n in ("s", "t")]
    # Circuits, not benches, take the flaky routes out; while degraded no client request
    # probes them, so they must count as usable once their cooldown ends.
    gw = await gateway_factory(
        config(
            model("m", *(route(up) for up in (*flaky, *healthy))),
            circuit={"failure_threshold": 1, "cooldown_seconds": 1.0},
            admin_key=ADMIN,
            routing={**ROUTING, "bench": {"failures": 100}},
        )
    )
    client = gw.openai()
    admin = gw.openai(api_key=ADMIN)

    async with watch(gw, subjects.event("mode")) as modes, circuit_events(gw) as circuits:
        for up in flaky:
            up.enqueue(Reply(500))
            with pytest.raises(openai.InternalServerError):
                await admin.chat.completions.create(
                    model="m", messages=HI, extra_headers={"X-Route-Pin": eid("m", up)}
                )
        entered = await modes.next(ModeChanged)
        left = await modes.next(ModeChanged)
        for _ in range(100):  # each draw probes a half-open flaky route with odds 3/5
            if all(len(up.requests) > 1 for up in flaky):
                break
            await client.chat.completions.create(model="m", messages=HI)
        back = [await circuits.circuit("closed", eid("m", up)) for up in flaky]

    assert (entered.mode, left.mode) == ("degraded", "normal")
    assert left.since >= entered.since + EXIT
    assert [t.reason for t in back] == ["probe succeeded"] * 3
