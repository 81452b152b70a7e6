"""``llmgw keys`` beside a gateway that answers its local socket but does not deliver the
command to the keys' owner (its bus reconnecting: 503 ``no_responders``; the owner silent: 504
``bus_timeout``): the command fails in one line and never writes the database behind the
running owner. With nothing on the socket, the offline path still writes the file.

The gateway here is the ``gateway`` fixture: a real HTTP server on the real Unix socket beside
the database, answering each admin command as a gateway in that state does."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import pytest

from actors.stores.api_keys import API_KEYS, ApiKeyStore
from actors.stores.provider_keys import LazyDb
from gateway.cli import keys_offline
from gateway.cli import main as cli
from tests.unit.gateway.cli.socket_gateway import LOST, SILENT

if TYPE_CHECKING:
    from pathlib import Path

    from tests.unit.gateway.cli.socket_gateway import FakeGateway

WHO = ("--org", "acme", "--user", "ann", "--role", "admin")


def _keys(tmp_path: Path, *args: str) -> int:
    return cli.main(["keys", *args, "--db", str(tmp_path / "gw.sqlite3"), "--json"])


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == ""  # no JSON result, so nothing a script could take for a key
    (line,) = err.splitlines()
    return line


def test_keys_create_beside_a_gateway_whose_bus_is_lost_fails_and_writes_no_file(
    tmp_path: Path, gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _keys(tmp_path, "create", *WHO, "--rpm", "5")

    line = _error_line(capsys)
    assert code == 2
    db = tmp_path / "gw.sqlite3"
    assert line == (
        f"llmgw keys: the gateway on {db} is running but could not reach its keys owner "
        f"({LOST}); nothing was written: retry in a moment"
    )
    assert gateway.paths == ["/admin/api_keys/create"]  # asked once, the limit never sent
    assert not db.exists()  # neither the key nor its limit written behind the owner


def test_keys_create_whose_owner_timed_out_says_the_outcome_is_unknown(
    tmp_path: Path, gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway.answer = (504, "bus_timeout", SILENT)

    code = _keys(tmp_path, "create", *WHO)

    line = _error_line(capsys)
    assert code == 2
    assert "is running but its keys owner did not answer in time" in line, line
    assert "the outcome of create is unknown; check with `llmgw keys list`" in line, line
    assert not (tmp_path / "gw.sqlite3").exists()  # a second key would duplicate the first


def test_keys_revoke_whose_connection_closed_before_its_answer_says_the_outcome_is_unknown(
    tmp_path: Path, gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    """The gateway read the revocation and closed the connection: this said "not delivered:
    Server disconnected without sending a response" though the key may be revoked."""
    gateway.drop = True

    code = _keys(tmp_path, "revoke", "gk-1a2b")

    line = _error_line(capsys)
    assert code == 2
    assert "not delivered" not in line, line
    assert "(the connection closed before the answer)" in line, line
    assert "the outcome of revoke is unknown; check with `llmgw keys list`" in line, line
    assert gateway.paths == ["/admin/api_keys/revoke"]


def test_keys_create_with_both_expiries_is_refused_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--expires-in silently won over --expires-at (the admin API refuses both)."""
    (tmp_path / "gw.sqlite3").touch()  # a database named, no gateway on it

    code = _keys(tmp_path, "create", *WHO, "--expires-in", "1d", "--expires-at", "2030-01-01")

    assert code == 2
    assert _error_line(capsys) == "llmgw keys: give one of --expires-in and --expires-at"
    assert (tmp_path / "gw.sqlite3").stat().st_size == 0


@pytest.mark.parametrize("at", ["2020-01-01T00:00:00Z", "1999-12-31"])
def test_keys_create_already_expired_is_refused_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], at: str
) -> None:
    """The key was created (exit 0, printed) and every request with it got 401 expired."""
    (tmp_path / "gw.sqlite3").touch()  # a database named, no gateway on it

    code = _keys(tmp_path, "create", *WHO, "--expires-at", at)

    assert code == 2
    assert _error_line(capsys) == (
        "llmgw keys: --expires-at: the key would be expired already: "
        "its expiry must be in the future"
    )
    assert (tmp_path / "gw.sqlite3").stat().st_size == 0


async def test_the_key_store_refuses_a_key_created_already_expired(tmp_path: Path) -> None:
    """The owner's rule, whichever path reaches it (the CLI offline, the keys actor)."""
    store = ApiKeyStore(LazyDb(str(tmp_path / "gw.sqlite3"), [API_KEYS]))
    try:
        with pytest.raises(ValueError, match="expired already"):
            await store.create(org="o", user="u", role="free", now=1000.0, expires=1000.0)
        assert await store.records() == []
    finally:
        await store.aclose()


@pytest.mark.parametrize("verb", [("list",), ("revoke", "gk-1a2b"), ("create", *WHO)])
def test_keys_on_a_file_that_is_no_database_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: tuple[str, ...]
) -> None:
    """Each was a sqlite3.DatabaseError traceback."""
    (tmp_path / "gw.sqlite3").write_text("not a database\n")

    code = _keys(tmp_path, *verb)

    assert code == 2
    assert _error_line(capsys) == (
        "llmgw keys: cannot use the database file: file is not a database"
    )


def test_keys_revoke_and_list_beside_a_gateway_whose_bus_is_lost_fail_and_name_no_key(
    tmp_path: Path, gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "gk-live-0123456789abcdef0123456789abcdef"  # revoke takes the key itself too

    revoked = _keys(tmp_path, "revoke", secret)
    revoke_line = _error_line(capsys)
    listed = _keys(tmp_path, "list")
    list_line = _error_line(capsys)

    assert (revoked, listed) == (2, 2)
    assert "could not reach its keys owner" in revoke_line, revoke_line
    assert secret not in revoke_line and "0123456789abcdef" not in revoke_line
    assert "could not reach its keys owner" in list_line, list_line
    assert gateway.paths == ["/admin/api_keys/revoke", "/admin/api_keys/list"]
    assert not (tmp_path / "gw.sqlite3").exists()


def test_a_key_the_gateway_made_is_shown_when_its_limit_is_not_delivered(
    tmp_path: Path, gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    key = "gk-made-by-the-owner-0123456789abcdef"
    gateway.made = {"id": "gk-1a2b", "key": key, "org": "acme", "user": "ann", "role": "admin"}

    code = _keys(tmp_path, "create", *WHO, "--rpm", "5")

    out, err = capsys.readouterr()
    made = json.loads(out)
    (line,) = err.splitlines()
    assert code == 2
    assert (made["key"], made["via"], made["limit_delivered"]) == (key, "socket", "")
    assert line.startswith("llmgw keys: key gk-1a2b was created but its limit was not set"), line
    assert "could not reach its limits owner" in line and key not in line, line
    assert gateway.paths == ["/admin/api_keys/create", "/admin/limits/set"]
    assert not (tmp_path / "gw.sqlite3").exists()  # the limit not stored behind the owner


async def test_keys_create_with_nothing_on_the_socket_writes_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "gw.sqlite3"

    code = await asyncio.to_thread(_keys, tmp_path, "create", *WHO, "--rpm", "5")

    made = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (made["via"], made["database"], made["limit_delivered"]) == ("file", str(db), "stored")
    assert [row["id"] for row in await keys_offline.listing(str(db))] == [made["id"]]


def test_keys_create_for_a_cluster_no_host_answers_writes_no_file_nobody_reads(
    tmp_path: Path, nats_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A cluster keeps its keys in JetStream: a key written to the file would be shown as made
    # and refused by every host.
    db = tmp_path / "gw.sqlite3"
    config = tmp_path / "cluster.yaml"
    config.write_text(
        json.dumps(
            {"database": {"path": str(db)}, "bus": {"url": nats_url}, "cluster": {"enabled": True}}
        )
    )

    code = cli.main(["keys", "create", *WHO, "--config", str(config), "--json"])

    line = _error_line(capsys)
    assert code == 2
    assert line.startswith("llmgw keys: no gateway of the cluster answered on "), line
    assert f"a cluster never reads keys from {db}" in line
    assert not db.exists()
