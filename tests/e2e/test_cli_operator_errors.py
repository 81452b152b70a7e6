"""More of what an operator's command line meets, each run as the venv's ``llmgw`` script: a
gateway started at a NATS nobody serves, ``llmgw events`` given a kind that does not exist
or asked to catch up without NATS, and ``spend report`` given a duration."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import pytest

from tests.e2e.test_cli_operator import llmgw, one_line_error

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.e2e


def _dead_nats() -> tuple[socket.socket, str]:
    """A port bound and never listening (connections are refused), and its NATS URL."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s, f"nats://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("role", ["ingress", "actors"])
def test_serve_at_a_nats_nobody_serves_says_so_in_one_line(tmp_path: Path, role: str) -> None:
    held, url = _dead_nats()
    with held:
        done = llmgw(tmp_path, "serve", "--role", role, "--bus", url, "--port", "0")

    assert one_line_error(done) == f"llmgw: cannot connect to NATS at {url}: connection refused"
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written
