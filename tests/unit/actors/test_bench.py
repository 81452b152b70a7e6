"""The model bench, its background probe, the per-model breaker and the all-benched 503.

Pure ``EndpointHealth`` rules first (sliding window, Retry-After as a floor, lift, re-bench),
then the EndpointActor's events (``BenchChanged`` on ``llmgw.events.bench``, ``ProbeDue`` on
``llmgw.probe.due``) and the ModelActor's refusals (``AllCircuitsOpenError`` with the time to
the earliest recovery, ``ModelBreakerTripped``). Actors run on the in-process bus with a fake
clock; timers that must fire use sub-second durations and are awaited as events.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from actors import ChildSpec, EndpointActor, ModelActor, Supervisor
from actors.state.backoff import ProbeBackoff, first_probe_after
from actors.state.circuit import EndpointHealth
from actors.state.keypool import KeyPool
from actors.stores.snapshots import SnapshotStore
from schemas import (
    BenchChanged,
    CircuitTransition,
    EndpointState,
    ErrorCode,
    ErrorReply,
    ModelBreakerTripped,
    Observation,
    ProbeDue,
    ProbeGrant,
    ProbeRequest,
    ProbeResult,
    RouteCandidate,
    RoutePlan,
    RouteRequest,
    StateRequest,
    subjects,
)
from schemas.config import (
    BenchConfig,
    CircuitConfig,
    FailoverConfig,
    KeyPoolConfig,
    ModelConfig,
    RouteConfig,
    RoutingConfig,
)
from tests.unit.actors import WAIT, FakeClock, next_event

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from bus import InProcessBus, Subscription

EP = "m:local-8001"
CIRCUIT = CircuitConfig(failure_threshold=100, cooldown_seconds=30)
BENCH = BenchConfig(failures=3, window_seconds=900, duration_seconds=600)


def health(**bench: Any) -> EndpointHealth:
    return EndpointHealth(CIRCUIT, BenchConfig(**{**BENCH.model_dump(), **bench}))


# -- settings -----------------------------------------------------------------------------


def test_failover_bench_and_timeout_settings_default_to_the_spec_numbers() -> None:
    route = RouteConfig(kind="echo")
    assert (FailoverConfig().max_attempts, FailoverConfig().budget_seconds) == (20, 45.0)
    assert (route.ttft_timeout_seconds, route.idle_timeout_seconds) == (120.0, 60.0)
    b = BenchConfig()
    assert (b.failures, b.window_seconds, b.duration_seconds) == (3, 900.0, 600.0)
    assert (b.probe_after_fraction, b.model_breaker_failures) == (0.5, 0)


# -- EndpointHealth: the sliding window -------------------------------------------------------


def test_bench_third_retryable_failure_in_window_benches_for_the_duration() -> None:
    h = health()

    started = [h.note_retryable_failure(t) for t in (0.0, 100.0, 200.0)]

    assert started == [False, False, True]
    assert h.benched_until == 800.0
    assert h.benched(799.9) and not h.benched(800.0)


def test_bench_failures_spread_wider_than_the_window_never_bench() -> None:
    h = health()

    started = [h.note_retryable_failure(t) for t in (0.0, 500.0, 900.0, 1400.0, 1800.0)]

    # Any three of them span more than 900 s, so no window ever holds three.
    assert started == [False] * 5
    assert h.benched_until is None


def test_bench_retry_after_alone_below_the_failure_count_benches_nothing() -> None:
    h = health()

    assert not h.note_retryable_failure(0.0, retry_after=120.0)
    assert h.benched_until is None  # one 429 is the credential's business, not the model's


# -- EndpointHealth: Retry-After is a floor ---------------------------------------------------


def test_bench_retry_after_on_the_benching_failure_lengthens_the_bench() -> None:
    h = health(duration_seconds=30)
    h.note_retryable_failure(0.0)
    h.note_retryable_failure(1.0)

    assert h.note_retryable_failure(2.0, retry_after=60.0)
    assert h.benched_until == 62.0


def test_bench_shorter_retry_after_on_the_benching_failure_keeps_the_full_duration() -> None:
    h = health(duration_seconds=30)
    for t in (0.0, 1.0):
        h.note_retryable_failure(t)

    h.note_retryable_failure(2.0, retry_after=1.0)

    assert h.benched_until == 32.0


def test_bench_shorter_retry_after_never_shortens_a_running_bench() -> None:
    h = health(duration_seconds=30)
    for t in (0.0, 1.0, 2.0):
        h.note_retryable_failure(t)

    started = h.note_retryable_failure(10.0, retry_after=1.0)

    assert not started
    assert h.benched_until == 32.0


def test_bench_longer_retry_after_while_benched_extends_without_a_new_bench() -> None:
    h = health(duration_seconds=30)
    for t in (0.0, 1.0, 2.0):
        h.note_retryable_failure(t)

    started = h.note_retryable_failure(10.0, retry_after=120.0)

    assert not started  # an extension, not a new bench
    assert h.benched_until == 130.0


# -- EndpointHealth: lift and re-bench ---------------------------------------------------------


def test_bench_lift_clears_the_window_so_the_next_failure_alone_does_not_rebench() -> None:
    h = health()
    for t in (0.0, 1.0, 2.0):
        h.note_retryable_failure(t)
    h.note_retryable_failure(3.0)  # counted while benched

    assert h.lift_bench()
    assert not h.note_retryable_failure(4.0)
    assert not h.note_retryable_failure(5.0)
    assert h.benched_until is None
    assert h.note_retryable_failure(6.0)


def test_bench_failed_probe_rebenches_for_a_full_duration_from_now() -> None:
    h = health(duration_seconds=30)
    for t in (0.0, 1.0, 2.0):
        h.note_retryable_failure(t)

    h.rebench(17.0)

    assert h.benched_until == 47.0


def test_bench_probe_success_before_the_retry_after_floor_ends_the_bench_at_the_floor() -> None:
    h = health(duration_seconds=600)
    for t in (0.0, 1.0):
        h.note_retryable_failure(t)
    h.note_retryable_failure(2.0, retry_after=60.0)

    assert not h.probe_succeeded(30.0)
    assert h.benched_until == 62.0  # shortened to the provider's floor, not below it
    assert h.probe_succeeded(62.0)
    assert h.benched_until is None


def test_bench_probe_success_after_the_floor_lifts_at_once() -> None:
    h = health(duration_seconds=600)
    for t in (0.0, 1.0):
        h.note_retryable_failure(t)
    h.note_retryable_failure(2.0, retry_after=5.0)

    assert h.probe_succeeded(300.0)
    assert h.benched_until is None and h.floor_until is None


# -- EndpointActor: events ------------------------------------------------------------------


CANDIDATE = RouteCandidate(
    endpoint=EP,
    kind="openai_compat",
    base_url="http://127.0.0.1:8001/v1",
    upstream_model="up",
    credential_id="k-1",
)


@asynccontextmanager
async def running_endpoint(
    bus: InProcessBus, clock: FakeClock, **bench: Any
) -> AsyncIterator[EndpointActor]:
    settings = BenchConfig(**{**BENCH.model_dump(), **bench})
    actor = EndpointActor(EP, "m", CIRCUIT, bench=settings, candidate=CANDIDATE, clock=clock)
    root = Supervisor("test", children=[ChildSpec("endpoint", lambda: actor)])
    await root.start(bus)
    try:
        yield actor
    finally:
        await root.stop()


@asynccontextmanager
async def subscribed(bus: InProcessBus, subject: str) -> AsyncIterator[Subscription]:
    async with bus.subscribe(subject) as sub:
        yield sub


def obs(outcome: str, **kw: Any) -> Observation:
    return Observation(endpoint=EP, model="m", outcome=outcome, **kw)


async def observe(bus: InProcessBus, *observations: Observation) -> None:
    for o in observations:
        await bus.publish(subjects.observation(EP), o)


async def test_endpoint_third_failure_across_credentials_benches_with_event_and_state(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with (
        subscribed(bus, subjects.event("bench")) as events,
        subscribed(bus, subjects.endpoint_state(EP)) as states,
        running_endpoint(bus, clock),
    ):
        await observe(bus, *(obs("failure", status=500, credential_id=f"k-{i}") for i in (1, 2, 3)))
        bench = await next_event(events, BenchChanged)
        while (st := await next_event(states, EndpointState)).benched_until is None:
            pass

    assert (bench.endpoint, bench.model, bench.benched) == (EP, "m", True)
    assert bench.until == st.benched_until == clock.now + 600
    assert "3 failures within 900 s" in bench.reason


async def test_endpoint_cancelled_and_client_error_observations_never_bench(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with (
        subscribed(bus, subjects.event("bench")) as events,
        subscribed(bus, subjects.endpoint_state(EP)) as states,
        running_endpoint(bus, clock, failures=1),
    ):
        await next_event(states, EndpointState)  # the initial state
        await observe(
            bus,
            *(obs("cancelled") for _ in range(5)),
            *(obs("client_error", status=400) for _ in range(5)),
        )
        await observe(bus, obs("failure", status=500))  # a barrier: this one benches
        bench = await next_event(events, BenchChanged)
        st = await next_event(states, EndpointState)

    assert bench.benched
    assert st.consecutive_failures == 1  # nothing before the barrier counted


async def test_endpoint_key_pool_refusals_sent_nothing_and_never_bench(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with (
        subscribed(bus, subjects.endpoint_state(EP)) as states,
        running_endpoint(bus, clock, failures=2),
    ):
        await next_event(states, EndpointState)  # the initial state
        await observe(
            bus,
            *(
                obs("failure", status=None, error_kind="key_pool_exhausted", retry_after=20.0)
                for _ in range(3)
            ),
            obs("failure", status=500),
        )
        while (st := await next_event(states, EndpointState)).consecutive_failures < 4:
            pass

    assert st.benched_until is None  # one upstream failure of the two a bench needs


async def test_endpoint_benched_route_publishes_probe_due_and_an_ok_result_lifts(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with (
        subscribed(bus, subjects.event("bench")) as events,
        subscribed(bus, subjects.PROBE_DUE) as due,
        running_endpoint(bus, clock, failures=1, duration_seconds=0.2, probe_after_fraction=0.25),
    ):
        await observe(bus, obs("failure", status=503))
        benched = await next_event(events, BenchChanged)
        probe = await next_event(due, ProbeDue)
        await bus.publish(subjects.endpoint_probe_result(EP), ProbeResult(endpoint=EP, ok=True))
        lifted = await next_event(events, BenchChanged)

    assert benched.benched and not lifted.benched
    assert (probe.endpoint, probe.model, probe.candidate) == (EP, "m", CANDIDATE)
    assert lifted.reason == "background probe succeeded"
    assert lifted.until is None


async def test_endpoint_ok_probe_before_the_retry_after_floor_lifts_only_when_it_passes(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with (
        subscribed(bus, subjects.event("bench")) as events,
        subscribed(bus, subjects.endpoint_state(EP)) as states,
        running_endpoint(bus, clock, failures=1, duration_seconds=600),
    ):
        await observe(bus, obs("failure", status=503, retry_after=0.1))
        await next_event(events, BenchChanged)
        await bus.publish(subjects.endpoint_probe_result(EP), ProbeResult(endpoint=EP, ok=True))
        while (st := await next_event(states, EndpointState)).benched_until != 1000.1:
            pass
        clock.now += 1  # past the floor: its timer lifts the bench
        lifted = await next_event(events, BenchChanged)

    assert st.benched_until == pytest.approx(1000.1)
    assert not lifted.benched and lifted.reason == "bench ran out"


async def test_endpoint_failed_probe_result_rebenches_for_a_full_duration(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with (
        subscribed(bus, subjects.event("bench")) as events,
        running_endpoint(bus, clock, failures=1, duration_seconds=600),
    ):
        await observe(bus, obs("failure", status=503))
        first = await next_event(events, BenchChanged)
        clock.now += 400
        await bus.publish(
            subjects.endpoint_probe_result(EP),
            ProbeResult(endpoint=EP, ok=False, detail="HTTP 503"),
        )
        again = await next_event(events, BenchChanged)

    assert first.until == 1600.0
    assert again.benched and again.until == 2000.0
    assert again.reason == "background probe failed: HTTP 503"


async def test_endpoint_probe_result_for_a_route_not_benched_changes_nothing(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with (
        subscribed(bus, subjects.event("bench")) as events,
        running_endpoint(bus, clock, failures=1),
    ):
        await bus.publish(
            subjects.endpoint_probe_result(EP), ProbeResult(endpoint=EP, ok=False, detail="late")
        )
        await observe(bus, obs("failure", status=503))  # a barrier
        bench = await next_event(events, BenchChanged)

    assert bench.reason.startswith("1 failures within")  # the barrier's, not the late result's


async def test_endpoint_bench_running_out_lifts_with_an_event(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with (
        subscribed(bus, subjects.event("bench")) as events,
        running_endpoint(bus, clock, failures=1, duration_seconds=0.1),
    ):
        await observe(bus, obs("failure", status=503))
        await next_event(events, BenchChanged)
        clock.now += 1  # past the bench: the probe is skipped, the end timer lifts it
        lifted = await next_event(events, BenchChanged)

    assert not lifted.benched and lifted.reason == "bench ran out"


# -- ModelActor: all benched, and the per-model breaker -------------------------------------


A, B = "m:local-8001", "m:local-8002"


def model_config() -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "id": "m",
            "route": [
                {"kind": "openai_compat", "base_url": f"http://127.0.0.1:{p}/v1"}
                for p in (8001, 8002)
            ],
        }
    )


@asynccontextmanager
async def running_model(
    bus: InProcessBus, clock: FakeClock, **routing: Any
) -> AsyncIterator[ModelActor]:
    settings = RoutingConfig.model_validate({"affinity": {"enabled": False}, **routing})
    root = Supervisor(
        "test",
        children=[ChildSpec("model", lambda: ModelActor(model_config(), settings, clock=clock))],
    )
    await root.start(bus)
    try:
        actor = root.child("model")
        assert isinstance(actor, ModelActor)
        yield actor
    finally:
        await root.stop()


async def ask(bus: InProcessBus) -> RoutePlan | ErrorReply:
    return await bus.request(
        subjects.model_route("m"), RouteRequest(model="m"), reply_type=RoutePlan, timeout=WAIT
    )


async def until_refused(bus: InProcessBus) -> ErrorReply:
    """Ask for plans until the model refuses (the view folds states asynchronously; no event
    says so, so a bounded loop of awaited requests)."""
    for _ in range(100):
        reply = await ask(bus)
        if isinstance(reply, ErrorReply):
            return reply
    raise AssertionError("the model never refused")


async def bench(bus: InProcessBus, ep: str, until: float, seq: int) -> None:
    await bus.publish(
        subjects.endpoint_state(ep),
        EndpointState(
            endpoint=ep,
            model="m",
            circuit_state="closed",
            availability=1.0,
            benched_until=until,
            seq=seq,
        ),
    )


async def test_model_with_every_route_benched_answers_retry_after_to_the_earliest_recovery(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with running_model(bus, clock):
        await bench(bus, A, clock.now + 600, 1)
        await bench(bus, B, clock.now + 45, 2)
        refused = await until_refused(bus)

    assert refused.code == ErrorCode.ALL_CIRCUITS_OPEN.value
    assert refused.retry_after == pytest.approx(45.0)


async def test_model_with_one_route_benched_plans_only_the_other(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with running_model(bus, clock):
        await bench(bus, A, clock.now + 600, 1)
        for _ in range(100):  # until the view has folded the state
            first = await ask(bus)
            assert isinstance(first, RoutePlan), first
            if A not in [c.endpoint for c in first.candidates]:
                break
        plans = [await ask(bus) for _ in range(20)]

    assert all(
        isinstance(p, RoutePlan) and [c.endpoint for c in p.candidates] == [B] for p in plans
    )


def model_obs(ep: str, outcome: str) -> Observation:
    return Observation(endpoint=ep, model="m", outcome=outcome, status=500)


async def test_model_breaker_after_n_consecutive_failures_on_any_route_trips_and_refuses(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with (
        subscribed(bus, subjects.event("model_breaker")) as events,
        running_model(
            bus, clock, bench={"model_breaker_failures": 3}, circuit={"cooldown_seconds": 30}
        ),
    ):
        for ep, outcome in ((A, "failure"), (B, "failure"), (A, "failure")):
            await bus.publish(subjects.observation(ep), model_obs(ep, outcome))
        tripped = await next_event(events, ModelBreakerTripped)
        refused = await ask(bus)
        clock.now += 30
        after = await ask(bus)

    assert (tripped.model, tripped.failures, tripped.until) == ("m", 3, 1030.0)
    assert isinstance(refused, ErrorReply) and refused.code == ErrorCode.ALL_CIRCUITS_OPEN.value
    assert refused.retry_after == pytest.approx(30.0)
    assert isinstance(after, RoutePlan)


async def test_model_breaker_streak_resets_on_success_and_ignores_cancels_and_client_errors(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with (
        subscribed(bus, subjects.event("model_breaker")) as events,
        running_model(bus, clock, bench={"model_breaker_failures": 2}),
    ):
        # One route, one subscription: the actor sees these in order.
        for outcome in ("failure", "success", "failure", "cancelled", "client_error"):
            await bus.publish(subjects.observation(A), model_obs(A, outcome))
        before = await ask(bus)
        await bus.publish(subjects.observation(A), model_obs(A, "failure"))
        tripped = await next_event(events, ModelBreakerTripped)

    # The success broke the first streak; the cancel and the 400 neither count nor reset.
    assert isinstance(before, RoutePlan), before
    assert tripped.failures == 2


async def test_model_breaker_ignores_key_pool_refusals_which_sent_nothing(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    refusal = Observation(
        endpoint=A, model="m", outcome="failure", error_kind="key_pool_exhausted", retry_after=20.0
    )
    async with (
        subscribed(bus, subjects.event("model_breaker")) as events,
        running_model(bus, clock, bench={"model_breaker_failures": 2}),
    ):
        for o in (model_obs(A, "failure"), refusal, refusal):
            await bus.publish(subjects.observation(A), o)
        before = await ask(bus)
        await bus.publish(subjects.observation(A), model_obs(A, "failure"))
        tripped = await next_event(events, ModelBreakerTripped)

    assert isinstance(before, RoutePlan), before  # two refusals made no streak
    assert tripped.failures == 2  # and did not break the real one either


async def test_model_breaker_at_zero_never_trips(bus: InProcessBus, clock: FakeClock) -> None:
    async with running_model(bus, clock, circuit={"cooldown_seconds": 30}):
        for _ in range(10):
            await bus.publish(subjects.observation(A), model_obs(A, "failure"))
        replies = [await ask(bus) for _ in range(20)]

    assert all(isinstance(r, RoutePlan) for r in replies)


# -- background probes: after the circuit cooldown, then with backoff ------------------------


def test_probe_backoff_starts_at_the_cooldown_doubles_and_stops_before_the_end() -> None:
    first = first_probe_after(30.0, 0.5, 600.0)
    b = ProbeBackoff(first)
    delays = []
    now = 0.0
    while (d := b.next_delay(now, 600.0)) is not None:
        now += d
        delays.append(d)

    assert first == 30.0  # not halfway (300 s) into the bench
    assert delays == [30.0, 60.0, 120.0, 240.0]  # the next would land at 930 s, past 600 s
    assert first_probe_after(30.0, 0.5, 15.0) == 7.5  # a short mute: partway through it


def test_probe_gaps_double_up_to_the_cap_so_a_long_outage_is_found_over_soon_after() -> None:
    b = ProbeBackoff(30.0, cap=60.0)
    delays = []
    now = 0.0
    while (d := b.next_delay(now, 600.0)) is not None:
        now += d
        delays.append(d)

    # Uncapped, an outage ending at 300 s was found at 450 s; now by 330 s.
    assert delays == [30.0, 60.0, *[60.0] * 8]


async def test_endpoint_bench_is_probed_after_the_cooldown_again_after_a_failure_and_lifted_by_a_credential_probe(  # noqa: E501
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    quick = CircuitConfig(failure_threshold=100, cooldown_seconds=0.05)
    actor = EndpointActor(EP, "m", quick, bench=BENCH, candidate=CANDIDATE, clock=clock)
    root = Supervisor("test", children=[ChildSpec("endpoint", lambda: actor)])
    async with (
        subscribed(bus, subjects.event("bench")) as events,
        subscribed(bus, subjects.PROBE_DUE) as due,
    ):
        await root.start(bus)
        try:
            await observe(bus, *(obs("failure", status=503) for _ in range(3)))
            benched = await next_event(events, BenchChanged)
            first = await next_event(due, ProbeDue)  # the bench runs 600 s: not halfway
            await bus.publish(
                subjects.endpoint_probe_result(EP),
                ProbeResult(endpoint=EP, ok=False, detail="HTTP 503", credential_id="k-1"),
            )
            rebenched = await next_event(events, BenchChanged)
            second = await next_event(due, ProbeDue)
            # A muted credential's probe that succeeds proves the route answers too.
            await bus.publish(
                subjects.endpoint_probe_result(EP),
                ProbeResult(endpoint=EP, ok=True, credential_id="k-2", credential_only=True),
            )
            lifted = await next_event(events, BenchChanged)
        finally:
            await root.stop()

    assert benched.until == clock.now + 600
    assert first.candidate == second.candidate == CANDIDATE
    assert rebenched.benched and rebenched.reason == "background probe failed: HTTP 503"
    assert not lifted.benched and lifted.reason == "background probe succeeded"
    assert actor.state().benched_until is None


async def test_endpoint_failed_credential_probe_never_rebenches_the_route(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with (
        subscribed(bus, subjects.event("bench")) as events,
        running_endpoint(bus, clock, failures=1, duration_seconds=600) as actor,
    ):
        await observe(bus, obs("failure", status=503))
        first = await next_event(events, BenchChanged)
        clock.now += 100
        await bus.publish(
            subjects.endpoint_probe_result(EP),
            ProbeResult(endpoint=EP, ok=False, credential_id="k-2", credential_only=True),
        )
        state = await bus.request(
            subjects.endpoint_get(EP), StateRequest(), reply_type=EndpointState, timeout=WAIT
        )

    assert isinstance(state, EndpointState) and state.benched_until == first.until
    assert actor.state().benched_until == first.until


# -- snapshots: circuits and benches outlive a restart ---------------------------------------


async def test_endpoint_restarted_half_open_is_probed_in_the_background_if_no_request_does(
    bus: InProcessBus,
    tmp_path: Path,
) -> None:
    # Saved while half-open (its probe never taken): after the restart no transition comes
    # to schedule the circuit's background probe, so the restore must.
    store = await SnapshotStore.open(tmp_path / "snap.sqlite3")
    circuit = CircuitConfig(failure_threshold=1, cooldown_seconds=0.05)
    actor = EndpointActor(EP, "m", circuit, candidate=CANDIDATE, snapshots=store)
    try:
        await store.save(actor.name, b'{"state": "half_open"}', 0.0)
        async with (
            subscribed(bus, subjects.PROBE_DUE) as due,
            subscribed(bus, subjects.event("circuit")) as circuits,
        ):
            root = Supervisor("test", children=[ChildSpec("endpoint", lambda: actor)])
            await root.start(bus)
            try:
                probe = await next_event(due, ProbeDue)
                ok = ProbeResult(endpoint=EP, ok=True)
                await bus.publish(subjects.endpoint_probe_result(EP), ok)
                closed = await next_event(circuits, CircuitTransition)
            finally:
                await root.stop()
    finally:
        await store.aclose()

    assert probe.candidate == CANDIDATE
    assert (closed.old, closed.new, closed.reason) == ("half_open", "closed", "probe succeeded")


async def test_endpoint_restart_keeps_the_open_circuit_and_the_bench_for_what_remains(
    bus: InProcessBus,
    clock: FakeClock,
    tmp_path: Path,
) -> None:
    store = await SnapshotStore.open(tmp_path / "snap.sqlite3")
    settings = BenchConfig(failures=1, window_seconds=900, duration_seconds=600)
    circuit = CircuitConfig(failure_threshold=1, cooldown_seconds=30)

    def make() -> EndpointActor:
        return EndpointActor(
            EP, "m", circuit, bench=settings, candidate=CANDIDATE, snapshots=store, clock=clock
        )

    try:
        root = Supervisor("test", children=[ChildSpec("endpoint", make)])
        await root.start(bus)
        async with subscribed(bus, subjects.event("bench")) as events:
            await observe(bus, obs("failure", status=503))
            benched = await next_event(events, BenchChanged)
        await root.stop()

        clock.now += 10  # the process was down for 10 s
        again = Supervisor("test", children=[ChildSpec("endpoint", make)])
        await again.start(bus)
        try:
            restored = await bus.request(
                subjects.endpoint_get(EP), StateRequest(), reply_type=EndpointState, timeout=WAIT
            )
            early = await bus.request(
                subjects.endpoint_probe(EP), ProbeRequest(), reply_type=ProbeGrant, timeout=WAIT
            )
            clock.now += 20  # the cooldown has run out: the one probe is admitted
            late = await bus.request(
                subjects.endpoint_probe(EP), ProbeRequest(), reply_type=ProbeGrant, timeout=WAIT
            )
        finally:
            await again.stop()
    finally:
        await store.aclose()

    assert isinstance(restored, EndpointState)
    assert (restored.circuit_state, restored.open_until) == ("open", 1030.0)
    assert restored.benched_until == 1600.0
    assert restored.bench_reason == benched.reason == "1 failures within 900 s"  # and why
    assert isinstance(early, ProbeGrant) and not early.granted and early.retry_after == 20.0
    assert isinstance(late, ProbeGrant) and late.granted


async def test_endpoint_a_reload_points_elsewhere_starts_with_a_closed_circuit_and_no_bench(
    bus: InProcessBus,
    clock: FakeClock,
    tmp_path: Path,
) -> None:
    """Same endpoint id, another upstream (an anthropic route's base_url, an upstream model):
    the old upstream's open circuit and bench were restored onto it, so the reload that
    repointed a sick route left it unused for up to the bench's 10 minutes."""
    store = await SnapshotStore.open(tmp_path / "snap.sqlite3")
    settings = BenchConfig(failures=1, window_seconds=900, duration_seconds=600)
    circuit = CircuitConfig(failure_threshold=1, cooldown_seconds=30)
    elsewhere = msgspec.structs.replace(CANDIDATE, base_url="http://127.0.0.1:8001/mirror/v1")

    def make(candidate: RouteCandidate) -> Supervisor:
        actor = EndpointActor(
            EP, "m", circuit, bench=settings, candidate=candidate, snapshots=store, clock=clock
        )
        return Supervisor("test", children=[ChildSpec("endpoint", lambda: actor)])

    async def state_after_restart(candidate: RouteCandidate) -> Any:
        root = make(candidate)
        await root.start(bus)
        try:
            return await bus.request(
                subjects.endpoint_get(EP), StateRequest(), reply_type=EndpointState, timeout=WAIT
            )
        finally:
            await root.stop()

    try:
        root = make(CANDIDATE)
        await root.start(bus)
        async with subscribed(bus, subjects.event("bench")) as events:
            await observe(bus, obs("failure", status=503))
            await next_event(events, BenchChanged)
        await root.stop()
        kept = await state_after_restart(CANDIDATE)
        repointed = await state_after_restart(elsewhere)
        back = await state_after_restart(CANDIDATE)  # the old upstream's state is gone
    finally:
        await store.aclose()

    assert (kept.circuit_state, kept.benched_until) == ("open", 1600.0)
    assert (repointed.circuit_state, repointed.benched_until) == ("closed", None)
    assert (back.circuit_state, back.benched_until) == ("closed", None)


def test_key_pool_mutes_restore_for_what_remains_and_only_for_declared_keys() -> None:
    settings = KeyPoolConfig(mute_seconds=60, sole_key_tolerance=0)
    pool = KeyPool("p", settings, [("k-1", "free"), ("k-2", "free")])
    pool.record("k-1", status=429, outcome="failure", role="free", now=0.0, retry_after=90.0)
    saved = pool.durable(10.0)

    fresh = KeyPool("p", settings, [("k-1", "free")])
    back = fresh.restore({**saved, "k-gone": (500.0, 0.0, 60.0, 0)}, 30.0)

    assert back == ["k-1"]
    assert fresh.muted_until("k-1", 30.0) == 90.0
    assert fresh.lift("k-1", 40.0) == 90.0  # the provider's Retry-After floor came back too
