"""Fixtures of the CLI's unit tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.unit.gateway.cli.socket_gateway import serving

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.unit.gateway.cli.socket_gateway import FakeGateway


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[FakeGateway]:
    """A stand-in gateway on ``tmp_path/gw.sqlite3``'s local socket (``socket_gateway``)."""
    yield from serving(tmp_path / "gw.sqlite3")
