"""``llmgw admin --bus``: how long it keeps trying a bus that accepts no connection (a few
seconds by default, reported in one line; an explicit ``--timeout`` that long)."""

from __future__ import annotations

from typing import Any

import pytest

from bus import BusClosedError
from gateway.cli import admin
from gateway.cli import main as cli


@pytest.mark.parametrize(("argv", "waited"), [((), 5.0), (("--timeout", "120"), 120.0)])
def test_admin_at_a_dead_bus_waits_a_few_seconds_unless_told_longer(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...],
    waited: float,
) -> None:
    asked: list[float] = []

    async def refused(url: str, **kw: Any) -> Any:
        asked.append(kw["connect_timeout"])
        raise BusClosedError(f"cannot connect to NATS at {url}: connection refused")

    monkeypatch.setattr(admin, "open_bus", refused)
    args = cli._parser().parse_args(["admin", "show", "--bus", "nats://127.0.0.1:9", *argv])

    code = admin.run(args)

    assert (code, asked) == (2, [waited])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot connect to NATS" in err, err
