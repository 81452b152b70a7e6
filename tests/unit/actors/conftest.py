"""Fixtures for actor unit tests: an in-process bus and a fake clock."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from bus import InProcessBus
from schemas.config import DatabaseConfig
from tests.unit.actors import FakeClock
from tests.unit.actors.log_databases import LogDatabase

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock at t=1000 s; tests move it by hand."""
    c = FakeClock()
    c.now = 1000.0
    return c


@pytest.fixture
async def shared(clock: FakeClock) -> AsyncIterator[InProcessBus]:
    """An in-process bus on the fake clock (the NATS cluster several hosts share)."""
    b = InProcessBus(clock=clock)
    yield b
    await b.aclose()


@pytest.fixture(params=["sqlite", "postgres"])
def log_db(request: pytest.FixtureRequest, tmp_path: Path) -> LogDatabase:
    """The request log's database, once SQLite (the default) and once PostgreSQL
    (``database.url``): the StoreActor's contract suite runs over both."""
    if request.param == "sqlite":
        return LogDatabase("sqlite", DatabaseConfig(path=str(tmp_path / "log.db")))
    url = str(request.getfixturevalue("postgres_url"))
    return LogDatabase("postgres", DatabaseConfig(path=str(tmp_path / "llmgw.db"), url=url))
