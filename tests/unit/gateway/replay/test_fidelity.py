"""Fidelity of the replay: an outage window produces the benches, circuit openings, bench
probes and degraded-mode entry and exit the gateway's own settings put them at, in virtual
time (the bench prober runs beside the actors as in a serving process)."""

from __future__ import annotations

from gateway.replay.providers import ProvidersFile
from gateway.replay.runner import replay_config
from gateway.replay.trace import TraceRequest
from gateway.replay.vloop import run_virtual
from schemas.config import GatewayConfig

OUTAGE_START, OUTAGE_END = 10.0, 200.0


def _route(name: str, *, fallback: bool) -> dict[str, object]:
    return {"kind": "openai_compat", "base_url": f"http://{name}/v1", "fallback_only": fallback}


def test_outage_of_two_of_three_routes_benches_and_degrades_when_the_settings_say() -> None:
    config = GatewayConfig.model_validate(
        {
            "routing": {"affinity": {"enabled": False}},
            "models": [
                {
                    "id": "m",
                    "route": [
                        _route("a", fallback=False),
                        _route("b", fallback=True),
                        _route("c", fallback=True),
                    ],
                }
            ],
        }
    )
    down = [{"start": OUTAGE_START, "end": OUTAGE_END, "kind": "connect"}]
    steady = {"median": 0.2, "p90": 0.2}
    providers = ProvidersFile.model_validate(
        {
            "providers": [
                {"endpoint": "m:a", "ttft": steady, "outages": down},
                {"endpoint": "m:b", "ttft": steady, "outages": down},
                {"endpoint": "m:c", "ttft": steady},
            ]
        }
    )
    # One request a second for 20 minutes: each tries a, then b, then c.
    trace = [
        TraceRequest(id=f"r{i}", t=float(i), model="m", output_tokens=10, stream=False)
        for i in range(1200)
    ]
    run = run_virtual(replay_config("outage", config, trace, providers, seed=1))

    routing = config.routing
    third_failure = OUTAGE_START + routing.circuit.failure_threshold - 1  # requests at 10, 11, 12
    tick = routing.degraded.pass_interval_seconds  # the mode is judged on this grid

    def next_tick(t: float) -> float:
        return -(-t // tick) * tick

    # The bench prober's schedule (actors/state/backoff.py): the first probe after the circuit
    # cooldown, then each gap doubled; the first probe after the outage brings both back.
    gap = min(
        routing.circuit.cooldown_seconds,
        routing.bench.probe_after_fraction * routing.bench.duration_seconds,
    )
    probes = [third_failure + gap]
    while probes[-1] < OUTAGE_END:
        gap *= 2
        probes.append(probes[-1] + gap)
    assert probes == [42.0, 102.0, 222.0]

    log = [(round(t.at, 3), t.kind, t.endpoint, t.state) for t in run.transitions]
    expected = {
        (third_failure, "bench", "m:a", "benched"),
        (third_failure, "circuit", "m:a", "open"),
        (third_failure, "bench", "m:b", "benched"),
        (third_failure, "circuit", "m:b", "open"),
        (third_failure + routing.circuit.cooldown_seconds, "circuit", "m:a", "half_open"),
        (third_failure + routing.circuit.cooldown_seconds, "circuit", "m:b", "half_open"),
        # A third of the routes healthy, below the threshold, for entry_seconds.
        (next_tick(third_failure + routing.degraded.entry_seconds), "mode", "", "degraded"),
        # Each failed probe benches the route again.
        *((t, "bench", e, "benched") for t in probes[:-1] for e in ("m:a", "m:b")),
    }
    assert expected <= set(log)
    back = {e: at for at, kind, e, state in log if kind == "bench" and state == "unbenched"}
    # The recovering probe (one route after the other, 0.2 s each) unbenches them.
    assert sorted(back) == ["m:a", "m:b"]
    assert all(probes[-1] < at < probes[-1] + 1 for at in back.values())
    # Healthy again from then, for exit_seconds.
    normal = next_tick(max(back.values()) + routing.degraded.exit_seconds)
    assert (normal, "mode", "", "normal") in log
    assert [t for t in log if t[1] == "mode"] == [
        (next_tick(third_failure + routing.degraded.entry_seconds), "mode", "", "degraded"),
        (normal, "mode", "", "normal"),
    ]
    assert all(o.served for o in run.outcomes)
    during = {o.endpoint for o in run.outcomes if OUTAGE_START <= o.t < probes[-1]}
    assert during == {"m:c"}
    assert {o.endpoint for o in run.outcomes if o.t >= probes[-1] + 1} == {"m:a"}
    # The probes were billed as the prober's, not as requests'.
    assert set(run.probes) == {"m:a", "m:b"}
