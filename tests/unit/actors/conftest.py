"""Fixtures for actor unit tests: an in-process bus and a fake clock."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from bus import InProcessBus
from tests.unit.actors import FakeClock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@pytest.fixture
async def bus() -> AsyncIterator[InProcessBus]:
    """A fresh in-process bus, closed after the test."""
    b = InProcessBus()
    yield b
    await b.aclose()


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock at t=1000 s; tests move it by hand."""
    c = FakeClock()
    c.now = 1000.0
    return c
