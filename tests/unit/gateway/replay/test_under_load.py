"""Routing under load (issue #24) on the scenario library's short traces: a queueing route's
limit is learned and traffic spills before the queue buries it, RouteWise sees queueing and
profiles every route in-band, and traffic leaves a dead or slowed route within two seconds.
The replay is deterministic (seeded, virtual time), so these are exact outcomes, not timings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.cli.replay import scenario_dir
from gateway.process.config import load_config
from gateway.replay.compare import compare
from gateway.replay.providers import ProvidersFile, load_providers
from gateway.replay.synth import load_synth, synthesize

if TYPE_CHECKING:
    from gateway.replay.outcome import RunResult

FASTEST = "m:p8"  # what the outage kills and the drift slows


def _replay(
    name: str, configs: tuple[str, ...], seconds: float, providers: ProvidersFile | None = None
) -> tuple[dict[str, Any], list[RunResult]]:
    folder = scenario_dir(name)
    trace = synthesize(load_synth(folder / "synth.yaml"), seed=5, duration_seconds=seconds)
    loaded = [(c, load_config(str(folder / "configs" / f"{c}.yaml"))) for c in configs]
    return compare(loaded, trace, providers or load_providers(folder / "providers.yaml"), seed=5)


def _moved_to(name: str, at: float, end: float) -> ProvidersFile:
    """The scenario's providers with its outage (``at`` to ``end``) or its drift (from ``at``,
    reached in half a second) moved early enough for a short trace."""
    raw = load_providers(scenario_dir(name) / "providers.yaml").model_dump()
    for p in raw["providers"]:
        for outage in p.get("outages") or ():
            outage["start"], outage["end"] = at, end
        for drift in p.get("drift") or ():
            drift["at"], drift["ramp"] = at, 0.5
    return ProvidersFile.model_validate(raw)


def _sent_to(run: RunResult, endpoint: str, since: float) -> int:
    """Requests arriving from ``since`` that had an attempt (not a probe) on ``endpoint``."""
    arrived = {o.request_id: o.at for o in run.outcomes}
    return sum(
        1
        for rid, attempts in run.observations.items()
        if arrived.get(rid, -1.0) >= since
        and any(a.endpoint == endpoint and not a.probe for a in attempts)
    )


def test_every_route_cooling_at_once_is_waited_out_not_answered_503() -> None:
    report, _ = _replay("ratelimited", ("equal",), 30.0)
    equal = report["configs"]["equal"]

    # Before: 6 of 907 were answered 429 or 503 in the moments every route was cooling after
    # its 429 (Retry-After: 1); each now waits for the first reset instead (at most
    # failover.cooling_wait_seconds), which the tail barely shows.
    assert equal["served"] == equal["requests"]
    assert equal["rate_limited_attempts"] > 0  # the providers did push back
    assert equal["ttft_p99"] < 1.5


def test_saturating_routes_are_not_queued_past_their_learned_limit() -> None:
    report, _ = _replay("saturating", ("primary", "routewise-a1"), 20.0)
    primary, fastest = report["configs"]["primary"], report["configs"]["routewise-a1"]
    slo = primary["slo_seconds"]

    # Before: the primary queued everything (mean 25 s) and RouteWise drove routes into
    # queues it saw only once its window moved (mean 3.5 s, p99 15 s).
    for summary in (primary, fastest):
        assert summary["served"] == summary["requests"]
    assert primary["ttft_mean"] < slo
    assert fastest["ttft_p99"] < slo
    assert fastest["ttft_mean"] < primary["ttft_mean"]
    # The cheapest fill's primary spilled along its fallbacks instead of queueing on p1.
    assert len([r for r, n in primary["share_by_route"]["routes"].items() if sum(n)]) >= 6
    # Every admissible route served real traffic: none left unprofiled.
    assert all(sum(n) for n in fastest["share_by_route"]["routes"].values())


def test_traffic_leaves_a_dead_route_within_two_seconds() -> None:
    _, runs = _replay(
        "outage", ("equal", "routewise-a1"), 20.0, _moved_to("outage", at=8.0, end=1000.0)
    )

    for run in runs:
        assert _sent_to(run, FASTEST, since=0.0) > 0, run.name  # it was in use before
        assert _sent_to(run, FASTEST, since=10.0) == 0, run.name


def test_routewise_leaves_a_slowed_route_within_two_seconds() -> None:
    _, (run,) = _replay("drift", ("routewise-a1",), 20.0, _moved_to("drift", at=8.0, end=1000.0))
    arrived_late = sum(1 for o in run.outcomes if o.at >= 10.0)

    assert _sent_to(run, FASTEST, since=0.0) - _sent_to(run, FASTEST, since=8.0) > 10
    # Twenty times slower: a stray request now and then re-measures it, no more.
    assert _sent_to(run, FASTEST, since=10.0) <= arrived_late // 20
