"""Fidelity of the replay: an outage window produces the benches, circuit openings and
degraded-mode entry and exit the gateway's own settings put them at, in virtual time."""

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
    bench_ends = third_failure + routing.bench.duration_seconds
    tick = routing.degraded.pass_interval_seconds  # the mode is judged on this grid

    def next_tick(t: float) -> float:
        return -(-t // tick) * tick

    seen = {(round(t.at, 3), t.kind, t.endpoint, t.state) for t in run.transitions}
    expected = {
        (third_failure, "bench", "m:a", "benched"),
        (third_failure, "circuit", "m:a", "open"),
        (third_failure, "bench", "m:b", "benched"),
        (third_failure, "circuit", "m:b", "open"),
        (third_failure + routing.circuit.cooldown_seconds, "circuit", "m:a", "half_open"),
        (third_failure + routing.circuit.cooldown_seconds, "circuit", "m:b", "half_open"),
        # A third of the routes healthy, below the threshold, for entry_seconds.
        (next_tick(third_failure + routing.degraded.entry_seconds), "mode", "", "degraded"),
        (bench_ends, "bench", "m:a", "unbenched"),
        (bench_ends, "bench", "m:b", "unbenched"),
        # Healthy again from the benches' end, for exit_seconds.
        (next_tick(bench_ends + routing.degraded.exit_seconds), "mode", "", "normal"),
    }
    assert expected <= seen
    closed = [t.at for t in run.transitions if t.kind == "circuit" and t.state == "closed"]
    # The first request after the bench (the primary, a) closes a's circuit with its answer.
    assert len(closed) == 1 and bench_ends < closed[0] < bench_ends + 1
    assert all(o.served for o in run.outcomes)
    during = [o.endpoint for o in run.outcomes if OUTAGE_START <= o.t < bench_ends]
    assert set(during) == {"m:c"}
    assert {o.endpoint for o in run.outcomes if o.t >= bench_ends + 1} == {"m:a"}
