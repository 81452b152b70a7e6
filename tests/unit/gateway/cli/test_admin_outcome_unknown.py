"""``llmgw admin`` when the command was sent but not answered in time (the gateway's
``bus_timeout``: its owner did not answer, or the bus was lost while it waited; or no answer
within ``--timeout``): the owner may have applied it, so a change says its outcome is unknown
and what to check before sending it again, a read-only verb to retry; never "not delivered",
which stays for a command that did not reach an owner. Exit 2 either way."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from bus import InProcessBus
from gateway.admin.local_socket import socket_path
from gateway.cli import admin
from gateway.cli import main as cli
from gateway.cli.common import not_reached
from schemas import READ_ONLY_ADMIN_VERBS, OutcomeUnknownError
from tests.unit.gateway.cli.socket_gateway import LOST, SILENT

if TYPE_CHECKING:
    from pathlib import Path

    from tests.unit.gateway.cli.socket_gateway import FakeGateway

PUT = ("rules", "put", "--json", '{"rules": []}')


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A config whose database is the one the ``gateway`` fixture serves (no NATS bus)."""
    monkeypatch.delenv("LLMGW_BUS", raising=False)
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump({"database": {"path": str(tmp_path / "gw.sqlite3")}}))
    return str(path)


def _admin(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(["admin", *argv])
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    return code, line


def test_a_change_the_owner_did_not_answer_in_time_has_an_unknown_outcome(
    tmp_path: Path, gateway: FakeGateway, config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway.answer = (503, "bus_timeout", SILENT)

    code, line = _admin(capsys, *PUT, "--config", config)

    sock = socket_path(tmp_path / "gw.sqlite3")
    assert code == 2
    assert line == (
        f"llmgw admin: the gateway on {sock} is running but its rules owner did not answer "
        f"in time ({SILENT}): the outcome of put is unknown; check with "
        "`llmgw admin rules get` before retrying"
    )
    assert gateway.paths == ["/admin/rules/put"]  # sent once, never again by the CLI


def test_a_read_only_verb_the_owner_did_not_answer_in_time_is_retried(
    gateway: FakeGateway, config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway.answer = (503, "bus_timeout", SILENT)

    code, line = _admin(capsys, "log", "stats", "--config", config)

    assert code == 2
    assert line.endswith(f"its log owner did not answer in time ({SILENT}): retry in a moment")
    assert "unknown" not in line and "not delivered" not in line, line


def test_a_change_with_no_answer_within_the_timeout_has_an_unknown_outcome(
    gateway: FakeGateway, config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway.hold.clear()  # the gateway took the command and says nothing

    delete = ("chains", "delete", "--arg", "name=x")
    code, line = _admin(capsys, *delete, "--timeout", "0.5", "--config", config)

    assert code == 2
    assert "its chains owner did not answer in time (no answer within the --timeout)" in line
    assert line.endswith(
        "the outcome of delete is unknown; check with `llmgw admin chains list` before retrying"
    ), line


def test_a_change_whose_connection_closed_before_its_answer_has_an_unknown_outcome(
    gateway: FakeGateway, config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The gateway read the command and closed the connection (it died running it): this
    said "not delivered: RemoteProtocolError: Server disconnected without sending a
    response", which tells the operator nothing was changed."""
    gateway.drop = True

    code, line = _admin(capsys, *PUT, "--config", config)

    assert code == 2
    assert "not delivered" not in line, line
    assert "(the connection closed before the answer)" in line, line
    assert line.endswith(
        "the outcome of put is unknown; check with `llmgw admin rules get` before retrying"
    ), line
    assert gateway.paths == ["/admin/rules/put"]


def test_a_change_that_reached_no_owner_is_still_not_delivered(
    gateway: FakeGateway, config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, line = _admin(capsys, *PUT, "--config", config)  # the gateway's bus is lost

    assert code == 2
    assert line == f"llmgw admin: rules put not delivered: {LOST}"


def test_a_change_whose_answer_the_bus_lost_has_an_unknown_outcome(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def joined(url: str, **kw: Any) -> InProcessBus:
        return InProcessBus()

    async def lost(*args: Any, **kw: Any) -> dict[str, Any]:
        raise OutcomeUnknownError("the bus was lost while the command waited for its answer")

    monkeypatch.setattr(admin, "open_bus", joined)
    monkeypatch.setattr(admin, "admin_request", lost)

    code, line = _admin(capsys, "reload", "--bus", "nats://ops:s3cret@127.0.0.1:4222")

    assert code == 2
    assert line.startswith("llmgw admin: the gateway on nats://ops:") and "s3cret" not in line
    assert line.endswith(
        "its config owner did not answer in time (the bus was lost while the command waited "
        "for its answer): the outcome of reload is unknown; check with `llmgw admin show` "
        "before retrying"
    ), line


def test_a_verb_read_only_in_another_area_that_timed_out_has_an_unknown_outcome(
    gateway: FakeGateway, config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway.answer = (503, "bus_timeout", SILENT)

    code, line = _admin(capsys, "routing", "get", "--config", config)  # read-only in rules

    assert code == 2
    assert line.endswith(
        "the outcome of get is unknown; check with `llmgw admin routing weights` before retrying"
    ), line


def _advice(area: str, verb: str) -> str:
    return str(not_reached("here", area, verb, "no answer", timed_out=True))


@pytest.mark.parametrize(
    ("area", "verb"),
    sorted((area, verb) for area, verbs in READ_ONLY_ADMIN_VERBS.items() for verb in verbs),
)
def test_every_read_only_verb_of_its_area_that_timed_out_is_retried(area: str, verb: str) -> None:
    assert _advice(area, verb).endswith("retry in a moment")


@pytest.mark.parametrize(
    ("area", "verb"),
    sorted(
        (area, verb)
        for area in [*READ_ONLY_ADMIN_VERBS, "bench"]
        for verb in set().union(*READ_ONLY_ADMIN_VERBS.values())
        if verb not in READ_ONLY_ADMIN_VERBS.get(area, ())
    ),
)
def test_a_verb_read_only_only_in_other_areas_that_timed_out_has_an_unknown_outcome(
    area: str, verb: str
) -> None:
    assert f"the outcome of {verb} is unknown" in _advice(area, verb)


@pytest.mark.parametrize("area", sorted(READ_ONLY_ADMIN_VERBS))
def test_what_a_change_says_to_check_is_a_read_only_verb_of_its_area(area: str) -> None:
    advice = _advice(area, "set")
    check = re.search(r"check with `([^`]+)`", advice)
    if check is None:  # an area without a command that shows its state
        assert advice.endswith("check its state before retrying"), advice
        return
    verb = check.group(1).split()[-1]  # `llmgw admin rules get`, `llmgw keys list`
    assert verb in READ_ONLY_ADMIN_VERBS[area], check.group(1)
