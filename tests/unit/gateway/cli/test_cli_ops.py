"""The operator subcommands' argument handling: durations, admin arguments, targets."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from gateway.cli import main as cli
from gateway.cli.admin import command_args
from gateway.cli.common import UsageError, bus_url, parse_duration, parse_since
from gateway.process.config import redacted

if TYPE_CHECKING:
    import argparse


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("10m", 600), ("2h", 7200), ("1d", 86_400), ("1.5", 1.5)]
)
def test_parse_duration_reads_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_parse_duration_of_garbage_raises_usage_error() -> None:
    with pytest.raises(UsageError, match="not a duration"):
        parse_duration("soon")


def admin_args(*argv: str) -> argparse.Namespace:
    return cli._parser().parse_args(["admin", *argv])


def test_a_since_reads_as_the_admin_apis_a_unit_a_duration_a_bare_number_unix_seconds() -> None:
    now = time.time()
    assert parse_since("1796614629") == 1796614629.0  # was read as 57 years ago
    assert parse_since("2026-12-01T09:00") == 1796115600.0
    assert now - 600 - 5 <= parse_since("10m") <= time.time() - 600
    with pytest.raises(UsageError, match="--since: not a time"):
        parse_since("soon")


def test_admin_reload_shortcut_is_config_reload() -> None:
    assert command_args(admin_args("reload")) == ("config", "reload", {})


def test_admin_args_merge_json_and_typed_key_values() -> None:
    got = command_args(
        admin_args(
            "log", "query", "--json", '{"model": "m"}', "--arg", "limit=5", "--arg", "kind=request"
        )
    )
    assert got == ("log", "query", {"model": "m", "limit": 5, "kind": "request"})


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--arg", "rpm=1e400"), "--arg rpm: 1e400 is too large a number"),
        (("--arg", "rpm=NaN"), "--arg rpm: NaN is no JSON number"),
        (("--json", '{"rpm": -Infinity}'), "--json: -Infinity is no JSON number"),
    ],
)
def test_a_number_json_cannot_carry_is_a_usage_error_naming_the_argument(
    argv: tuple[str, ...], says: str
) -> None:
    """``--arg rpm=1e400`` failed sending with "Out of range float values are not JSON
    compliant", naming no argument."""
    with pytest.raises(UsageError) as refused:
        command_args(admin_args("limits", "set", *argv))
    assert str(refused.value) == says


def test_admin_without_verb_for_an_area_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="a verb is needed"):
        command_args(admin_args("log"))


def test_an_inproc_bus_cannot_be_joined_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMGW_BUS", raising=False)
    with pytest.raises(UsageError, match="shared bus"):
        bus_url(admin_args("reload", "--bus", "inproc://"))


def test_redacted_masks_passwords_in_urls() -> None:
    assert redacted("no: nats://op:s3cret@h:4222 down") == "no: nats://op:***@h:4222 down"
