"""The serving process's collector settings (gateway.process.serve.settle_gc)."""

from __future__ import annotations

import gc

from gateway.process.serve import GC_THRESHOLDS, settle_gc


def test_settle_gc_freezes_what_startup_built_and_collects_the_young_less_often() -> None:
    before = gc.get_threshold()
    try:
        settle_gc()
        frozen = gc.get_freeze_count()
        thresholds = gc.get_threshold()
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    assert frozen > 1000  # this test process's modules and objects, at least
    assert thresholds == GC_THRESHOLDS and GC_THRESHOLDS[0] > before[0]
