"""Shared fixtures: each lives in tests/fixtures/ and is registered here."""

from __future__ import annotations

pytest_plugins = [
    "tests.fixtures.nats",
    "tests.fixtures.upstream",
    "tests.fixtures.gateway",
]
