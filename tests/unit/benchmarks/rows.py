"""A measured step as ``bench.py`` records it, for tests of what it reports."""

from __future__ import annotations

from typing import Any

from tests.benchmarks.bench import StepResult


def step_row(**fields: Any) -> StepResult:
    """A plain-chat gateway row of 200 requests at concurrency 64 (p50 1 ms), ``fields``
    replacing any of it."""
    row: dict[str, Any] = {
        "target": "gateway",
        "mode": "plain",
        "concurrency": 64,
        "duration": 2.0,
        "requests": 200,
        "errors": 0,
        "rps": 100.0,
        "p50_ms": 1.0,
        "p99_ms": 2.0,
        "mean_ms": 1.0,
        "ttfb_p50_ms": None,
        "ttfb_p99_ms": None,
    }
    return StepResult(**{**row, **fields})
