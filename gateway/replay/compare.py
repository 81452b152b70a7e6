"""Replaying one trace through several configs, one after another, into one report."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.replay.oracle import oracle_for
from gateway.replay.report import build_report
from gateway.replay.runner import replay_config
from gateway.replay.vloop import run_virtual

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.replay.outcome import RunResult
    from gateway.replay.providers import ProvidersFile
    from gateway.replay.trace import TraceKey, TraceRequest
    from schemas.config import GatewayConfig

Progress = Callable[[str, int, int], None]
"""Called with (config name, requests finished, requests in the trace)."""


def compare(
    configs: Sequence[tuple[str, GatewayConfig]],
    trace: Sequence[TraceRequest],
    providers: ProvidersFile,
    *,
    seed: int,
    keys: Sequence[TraceKey] = (),
    slo: float | None = None,
    progress: Progress | None = None,
) -> tuple[dict[str, Any], list[RunResult]]:
    """Each config on a fresh gateway (with the trace's gateway API keys ``keys``) and a
    fresh virtual loop; the report (oracle from the first config's routes and prices) and
    the runs. Raises what a replay raises."""
    runs: list[RunResult] = []
    for name, config in configs:

        def tick(done: int, name: str = name) -> None:
            if progress is not None:
                progress(name, done, len(trace))

        runs.append(
            run_virtual(
                replay_config(name, config, trace, providers, seed=seed, keys=keys, progress=tick)
            )
        )
    oracle = oracle_for(configs[0][1], providers, trace)
    report = build_report(runs, oracle, slo or providers.slo_ttft_seconds, seed)
    for (_, config), run in zip(configs, runs, strict=True):
        own = oracle_for(config, providers, trace)
        summary = report["configs"][run.name]
        at_served = own.ttft_at(summary["served"])
        summary["oracle"] = {
            **own.as_dict(),
            "ttft_mean_at_served": None if at_served is None else round(at_served, 6),
        }
    return report, runs
