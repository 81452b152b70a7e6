"""Shared fixtures: each lives in tests/fixtures/ and is registered here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.fixtures.tls_context import share_default_tls_context

if TYPE_CHECKING:
    import pytest

pytest_plugins = [
    "tests.fixtures.nats",
    "tests.fixtures.upstream",
    "tests.fixtures.raw_upstream",
    "tests.fixtures.upstream_bedrock",
    "tests.fixtures.gateway",
    "tests.fixtures.otlp",
    "tests.fixtures.postgres",
]

# Files whose tests run longest (a soak, several processes, CLI child processes, a browser):
# scheduled first, so with parallel workers no worker is left running one of them alone at
# the end of the run.
_LONGEST_FIRST = (
    "tests/e2e/test_soak.py",
    "multiprocess",
    "tests/e2e/test_cli_operator.py",
    "tests/e2e/test_operations_cli.py",
    "tests/e2e/test_config_secrets.py",
    "tests/e2e/test_nats_permissions.py",
    "tests/e2e/test_selection_openai_sdk.py",
    "tests/browser/",
)


def pytest_configure(config: pytest.Config) -> None:
    """Every httpx client shares one default TLS context (tests/fixtures/tls_context.py)."""
    share_default_tls_context()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the longest files' tests to the front (a stable sort: order within is kept)."""
    items.sort(key=lambda item: not any(part in item.nodeid for part in _LONGEST_FIRST))
