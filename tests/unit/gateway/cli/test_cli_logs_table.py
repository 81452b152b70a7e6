"""``llmgw logs``' table: what a caller chose (the model name it asked for) is shown with its
control characters escaped, so it can neither forge a row nor drive the operator's terminal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.cli.logs import _print

if TYPE_CHECKING:
    import pytest

FORGED = "x\n2026-12-06 03:00:00  request  1-1  gpt-4o  200\x1b]0;pwned\x07\x1b[2J"


def _row(requested: str) -> dict[str, Any]:
    return {
        "ts": 1_796_526_000.0,
        "kind": "request",
        "request_id": "1-2",
        "requested_model": requested,
        "model": "",
        "endpoint": "",
        "status": 404,
        "attempt": 0,
        "fallback": False,
        "latency_ms": 1.0,
        "ttft_ms": None,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cost_usd": 0.0,
        "error_kind": "route_not_found",
    }


def test_a_model_name_cannot_forge_a_row_or_reach_the_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # It was written raw: a newline printed a second, forged row, and the escapes set the
    # terminal's title and cleared its screen.
    _print([_row(FORGED)], as_json=False)

    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2  # the header and the one row
    assert "\x1b" not in lines[1] and "\x07" not in lines[1]
    assert "x\\n2026-12-06" in lines[1] and "\\x1b]0;pwned\\x07" in lines[1]


def test_a_plain_model_name_is_shown_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    _print([_row("gpt-4o / ünïcode")], as_json=False)

    assert "gpt-4o / ünïcode" in capsys.readouterr().out
