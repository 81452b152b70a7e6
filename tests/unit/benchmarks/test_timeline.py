"""tests/benchmarks/timeline.py: every seam it stamps still exists, and its table reads the
stamps of the usual requests."""

from __future__ import annotations

import importlib

import pytest

from tests.benchmarks.timeline import SEAMS, table


@pytest.mark.parametrize(("module", "path"), [(m, p) for m, p, _, _ in SEAMS])
def test_every_seam_is_in_the_code(module: str, path: str) -> None:
    owner = importlib.import_module(module)
    for name in path.split("."):
        owner = getattr(owner, name)

    assert callable(owner)


def test_the_table_gives_the_median_between_seams_of_the_usual_requests() -> None:
    us = 1000
    stamps = []
    for i in range(10):
        t = i * 1_000 * us
        stamps += [("client in", t), ("app", t + 10 * us), ("client out", t + (30 + i) * us)]
    stamps += [("client in", 99_000 * us), ("client out", 99_001 * us)]  # an odd one

    lines = table(stamps)

    assert lines[0] == "8 of 9 requests passed the seams in this order"  # warm-up dropped
    assert "| client in | app | 10.0 |" in lines
    assert "| app | client out | 25.5 |" in lines  # the median of 22..29
    assert lines[-1] == "| client in | client out | **35.5** |"
