"""More of what an operator's command line meets, each run as the venv's ``llmgw`` script: a
gateway started at a NATS nobody serves, ``llmgw events`` given a kind that does not exist
or asked to catch up without NATS, ``GET /events?since=`` and ``spend report`` given a
duration."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from gateway.adapters.sse import SSEParser
from tests.e2e.conftest import CHAT, WAIT, assert_openai_error, chat, config, model
from tests.e2e.test_cli_operator import llmgw, one_line_error
from tests.fixtures.gateway import GatewayProcess

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

ADMIN = "adm-cli-errors"


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


def test_serve_with_a_database_path_it_cannot_open_says_so_in_one_line(tmp_path: Path) -> None:
    """A ``database.path`` naming a directory was a sqlite3.OperationalError traceback."""
    folder = tmp_path / "db"
    folder.mkdir()
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(f"database: {{path: {folder}}}\nserver: {{port: 0}}\n")

    done = llmgw(tmp_path, "serve", "--config", str(cfg))

    assert one_line_error(done) == (
        f"llmgw: invalid configuration: {cfg}: database.path: cannot open {folder}: "
        "unable to open database file"
    )


def test_serve_with_a_config_that_is_not_utf8_says_so_in_one_line(tmp_path: Path) -> None:
    """A config saved as UTF-16 (a Windows editor's "Unicode") was a UnicodeDecodeError
    traceback."""
    cfg = tmp_path / "gw.yaml"
    cfg.write_bytes("server: {port: 0}\n".encode("utf-16"))

    done = llmgw(tmp_path, "serve", "--config", str(cfg))

    assert one_line_error(done) == (
        f"llmgw: invalid configuration: {cfg}: cannot read: not UTF-8 text (byte 0)"
    )


def test_events_with_a_kind_no_event_has_is_refused_in_one_line(tmp_path: Path) -> None:
    done = llmgw(tmp_path, "events", "--filter", "circuit,bogus")

    line = one_line_error(done)
    assert "'bogus'" in line and "circuit" in line and "decision" in line, line


async def test_events_with_a_count_below_one_is_refused_in_one_line(
    processes: list[GatewayProcess], tmp_path: Path
) -> None:
    """``--count 0`` or ``-1`` followed a running gateway forever: no number of events
    reaches it."""
    proc = GatewayProcess(["serve", "--port", "0"], cwd=tmp_path)
    processes.append(proc)
    await asyncio.to_thread(proc.start)

    for count in ("0", "-1"):
        done = await asyncio.to_thread(llmgw, tmp_path, "events", f"--count={count}")

        assert one_line_error(done) == f"llmgw events: --count: at least 1 event, not {count}"


async def test_logs_with_a_limit_below_one_is_refused_alike_online_and_offline(
    processes: list[GatewayProcess], tmp_path: Path
) -> None:
    """Asking the gateway said "HTTP 400: 'limit' must be a positive integer" and reading
    the file "'limit' must ...", both with exit 1 (a failure, not an argument error)."""
    proc = GatewayProcess(["serve", "--port", "0"], cwd=tmp_path)
    processes.append(proc)
    await asyncio.to_thread(proc.start)
    db = str(tmp_path / "llmgw.sqlite3")

    for limit in ("0", "-1"):
        online = await asyncio.to_thread(llmgw, tmp_path, "logs", f"--limit={limit}")
        offline = await asyncio.to_thread(llmgw, tmp_path, "logs", "--db", db, f"--limit={limit}")

        says = f"llmgw logs: --limit: at least 1 row, not {limit}"
        assert one_line_error(online) == says and one_line_error(offline) == says


async def test_admin_with_a_timeout_not_above_zero_is_refused_and_sends_nothing(
    processes: list[GatewayProcess], tmp_path: Path
) -> None:
    """``--timeout 0`` sent the command, gave up on its answer at once and said "not
    delivered: ReadError ...", while the owner applied it; ``-1`` said "Timeout value out
    of range"."""
    proc = GatewayProcess(["serve", "--port", "0"], cwd=tmp_path)
    processes.append(proc)
    await asyncio.to_thread(proc.start)

    for timeout in ("0", "-1", "nan"):
        done = await asyncio.to_thread(
            llmgw, tmp_path, "admin", "steering", "set_profile", "--arg", "profile=smartest",
            f"--timeout={timeout}",
        )  # fmt: skip

        assert one_line_error(done) == (
            f"llmgw admin: --timeout: seconds above 0 and under 86400, not {timeout}"
        )
    got = await asyncio.to_thread(llmgw, tmp_path, "admin", "steering", "get")
    assert json.loads(got.stdout)["profile"] == "balanced"


def test_events_beside_a_socket_no_gateway_listens_on_is_a_connection_error(
    tmp_path: Path,
) -> None:
    """A gateway killed leaves its socket file; ``llmgw events`` said "lost the gateway:
    ConnectError(...)" and exited 1, as if it had followed one."""
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(tmp_path / "llmgw.sqlite3.sock"))  # bound, never listening
    stale.close()
    (tmp_path / "llmgw.sqlite3").touch()

    done = llmgw(tmp_path, "events")

    line = one_line_error(done)
    assert line.startswith("llmgw events: cannot reach the gateway: "), line
    assert "lost" not in line, line


async def test_the_event_stream_refuses_a_kind_no_event_has(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await gateway_factory(config(model("m", {"kind": "echo"}), admin_key=ADMIN))

    resp = await gw.http().get("/events?kind=bogus", headers={"authorization": f"Bearer {ADMIN}"})

    assert assert_openai_error(resp, 400, "invalid_request")["param"] == "kind"


async def test_the_event_stream_takes_since_as_a_duration_or_a_time(
    gateway_factory: GatewayFactory,
) -> None:
    """``GET /events?since=`` reads a duration ago and an ISO 8601 time as every ``since``
    does (unix seconds too); anything else is a 400 naming the parameter."""
    gw = await gateway_factory(config(model("m", {"kind": "echo"}), admin_key=ADMIN))
    auth = {"authorization": f"Bearer {ADMIN}"}
    http = gw.http()
    changed_at = time.time()
    changed = await http.post(
        "/admin/steering/set_profile", json={"profile": "priority"}, headers=auth
    )
    assert changed.status_code == 200, changed.text
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)

    def ours(frame: dict[str, Any]) -> bool:
        # On NATS the events stream is the server's: other tests' admin events replay too.
        return (frame["area"], frame["verb"]) == ("steering", "set_profile") and float(
            frame["ts"]
        ) >= changed_at - 1

    replayed = []
    for since in ("10m", an_hour_ago.strftime("%Y-%m-%dT%H:%M:%S"), str(an_hour_ago.timestamp())):
        params = {"kind": "admin", "since": since}
        async with http.stream("GET", "/events", params=params, headers=auth) as resp:
            assert resp.status_code == 200, await resp.aread()
            parser, found = SSEParser(), False
            async with asyncio.timeout(WAIT):
                async for chunk in resp.aiter_bytes():
                    found = any(ours(json.loads(data)) for _, data in parser.feed(chunk))
                    if found:
                        break
        replayed.append(found)
    refused = await http.get("/events", params={"since": "ten minutes"}, headers=auth)

    assert replayed == [True] * 3
    assert assert_openai_error(refused, 400, "invalid_request")["param"] == "since"


async def test_events_since_and_spend_and_logs_take_durations_and_times_on_the_local_socket(
    processes: list[GatewayProcess], tmp_path: Path
) -> None:
    """The demo gateway on the in-process bus, reached through its local socket: ``events
    --since`` replays what that bus kept, and every ``since`` takes both a duration ago and
    an ISO 8601 time."""
    proc = GatewayProcess(["serve", "--port", "0"], cwd=tmp_path)
    processes.append(proc)
    await asyncio.to_thread(proc.start)
    async with httpx.AsyncClient(base_url=proc.url, timeout=WAIT) as client:
        assert (await client.post(CHAT, json=chat("demo"))).status_code == 200
    reload = await asyncio.to_thread(llmgw, tmp_path, "admin", "reload")
    assert reload.returncode == 0, reload.stderr
    an_hour_ago = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")

    events = await asyncio.to_thread(
        llmgw, tmp_path, "events", "--since", "10m", "--filter", "admin", "--count", "1"
    )
    spent = [
        await asyncio.to_thread(
            llmgw, tmp_path, "admin", "spend", "report", "--arg", f"since={since}"
        )
        for since in ("10m", an_hour_ago)
    ]
    logged = [
        await asyncio.to_thread(
            llmgw, tmp_path, "logs", "--since", since, "--kind", "request", "--json"
        )
        for since in ("10m", an_hour_ago)
    ]

    assert events.returncode == 0, events.stderr
    (line,) = events.stdout.splitlines()
    replayed = json.loads(line)
    assert (replayed["kind"], replayed["area"], replayed["verb"]) == ("admin", "config", "reload")
    for done in spent:
        assert done.returncode == 0, done.stderr
        assert [g["requests"] for g in json.loads(done.stdout)["groups"]] == [1]
    for done in logged:
        assert done.returncode == 0, done.stderr
        assert [json.loads(r)["requested_model"] for r in done.stdout.splitlines()] == ["demo"]


async def test_spend_report_refuses_an_argument_it_does_not_take_online_and_offline(
    processes: list[GatewayProcess], tmp_path: Path
) -> None:
    """With no gateway running, the report read from the file ignored a misspelt ``group``
    and answered by model, as if grouped as asked; the owner refuses it."""
    proc = GatewayProcess(["serve", "--port", "0"], cwd=tmp_path)
    processes.append(proc)
    await asyncio.to_thread(proc.start)
    report = ("admin", "spend", "report", "--arg", "group=key")

    online = await asyncio.to_thread(llmgw, tmp_path, *report)
    await asyncio.to_thread(proc.stop)
    offline = await asyncio.to_thread(llmgw, tmp_path, *report)

    says = "spend report takes no argument 'group' (it takes group_by, per_day, since, until)"
    for done in (online, offline):
        assert (done.returncode, done.stdout) == (1, ""), done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith("llmgw admin: spend report refused: ") and line.endswith(says)


def test_admin_given_json_nested_past_the_stack_says_so_in_one_line(tmp_path: Path) -> None:
    deep = '{"rules": ' + "[" * 100_000 + "]" * 100_000 + "}"
    (tmp_path / "rules.json").write_text(deep)

    done = llmgw(tmp_path, "admin", "rules", "put", "--file", str(tmp_path / "rules.json"))

    assert one_line_error(done).endswith("is JSON nested too deeply")


@pytest.mark.parametrize("port", ["65536", "-1"])
def test_serve_given_a_port_out_of_range_says_so_in_one_line(tmp_path: Path, port: str) -> None:
    """The config's ``server.port`` is refused past 65535; the flag was a traceback."""
    done = llmgw(tmp_path, "serve", f"--port={port}")

    assert one_line_error(done) == f"llmgw: --port {port}: a port is 0-65535 (0: any free one)"
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


@pytest.mark.parametrize(
    "command",
    [("serve", "--port", "0"), ("events",), ("admin", "show"), ("logs",), ("keys", "list")],
)
def test_a_bus_of_another_scheme_is_refused_in_one_line_without_its_password(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """``--bus redis://...`` was a traceback (``serve``, ``events``) or a line quoting the
    URL whole, its password included."""
    done = llmgw(tmp_path, *command, "--bus", "redis://ops:hunter2-pw@cache:6379")

    line = one_line_error(done)
    assert "hunter2-pw" not in done.stderr, done.stderr
    assert "redis://ops:***@cache:6379" in line and "nats://" in line, line
    assert list(tmp_path.iterdir()) == []
