"""Fixtures every unit test may use."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from bus import InProcessBus

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@pytest.fixture
async def bus() -> AsyncIterator[InProcessBus]:
    """A fresh in-process bus, closed after the test."""
    b = InProcessBus()
    yield b
    await b.aclose()
