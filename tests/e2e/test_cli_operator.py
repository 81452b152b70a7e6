"""The operator commands as a new user meets them, each run as the venv's ``llmgw`` script:
the local socket of a running gateway (no key, no --url), and the errors a command line can
make (one line, exit code 2, never a traceback)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import yaml

from actors.stores.request_log import INSERT, REQUEST_LOG, missing_columns, request_row
from schemas import RequestCompleted
from tests.e2e.conftest import CHAT, WAIT, chat
from tests.fixtures.gateway import GatewayProcess

pytestmark = pytest.mark.e2e

LLMGW = str(Path(sys.executable).parent / "llmgw")
PROCESS_WAIT = 30.0  # a CLI process starting Python on a loaded machine


def llmgw(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``llmgw ARGS`` in ``cwd`` and wait for it."""
    return subprocess.run(
        [LLMGW, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=PROCESS_WAIT,
        check=False,
        env={**os.environ, **(env or {})},
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a command that failed with exit code 2."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if not line.startswith(("usage:", " "))]
    assert len(lines) == 1, done.stderr
    return lines[0]


async def _serve(
    processes: list[GatewayProcess], cwd: Path, *args: str, env: dict[str, str] | None = None
) -> GatewayProcess:
    proc = GatewayProcess(["serve", "--port", "0", *args], env, cwd=cwd)
    processes.append(proc)
    return await asyncio.to_thread(proc.start)


# -- the local socket -------------------------------------------------------------------------


async def test_demo_gateway_answers_admin_and_logs_from_another_shell_without_key_or_url(
    processes: list[GatewayProcess],
    tmp_path: Path,
    bus_url: str,
) -> None:
    proc = await _serve(processes, tmp_path, "--bus", bus_url)
    sock = tmp_path / "llmgw.sqlite3.sock"
    async with httpx.AsyncClient(base_url=proc.url, timeout=WAIT) as client:
        assert (await client.post(CHAT, json=chat("demo"))).status_code == 200

    show = await asyncio.to_thread(llmgw, tmp_path, "admin", "show")
    reload = await asyncio.to_thread(llmgw, tmp_path, "admin", "reload")
    logs = await asyncio.to_thread(llmgw, tmp_path, "logs", "--json", "--kind", "request")
    mode = stat.S_IMODE(sock.stat().st_mode)
    await asyncio.to_thread(proc.stop)

    assert not sock.exists()  # removed at shutdown
    assert mode == 0o600
    assert show.returncode == 0, show.stderr
    assert json.loads(show.stdout)["models"] == ["demo"]
    assert reload.returncode == 0, reload.stderr
    assert json.loads(reload.stdout)["version"]
    assert logs.returncode == 0, logs.stderr
    # Through the gateway's StoreActor: the request is there before any flush interval.
    assert [json.loads(r)["requested_model"] for r in logs.stdout.splitlines()] == ["demo"]
    assert show.stderr == reload.stderr == logs.stderr == ""  # no httpx INFO lines either


async def test_local_socket_is_found_from_the_config_naming_the_database(
    processes: list[GatewayProcess],
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "database": {"path": str(data / "gw.db")},
                "models": [{"id": "m", "route": [{"kind": "echo"}]}],
            }
        )
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    await _serve(processes, tmp_path, "--config", str(cfg))

    found = await asyncio.to_thread(llmgw, elsewhere, "admin", "show", "--config", str(cfg))
    missing = await asyncio.to_thread(llmgw, elsewhere, "admin", "show")

    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["models"] == ["m"]
    assert stat.S_IMODE((data / "gw.db.sock").stat().st_mode) == 0o600
    assert "no gateway is serving llmgw.sqlite3" in one_line_error(missing)


# -- one line, exit code 2 ----------------------------------------------------------------------


def test_serve_on_a_taken_port_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        done = llmgw(tmp_path, "serve", "--port", str(port))

    assert (
        one_line_error(done) == f"llmgw: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


def test_logs_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    db = tmp_path / "gw.sqlite3"
    sqlite3.connect(db).close()

    with subprocess.Popen(
        [LLMGW, "logs", "--db", str(db)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone before the first line is written (`| head -0`)
        err = proc.stderr.read()
        proc.wait(timeout=PROCESS_WAIT)

    assert (proc.returncode, err) == (0, "")


def test_keys_create_with_a_word_for_expires_in_names_the_option(tmp_path: Path) -> None:
    done = llmgw(
        tmp_path,
        "keys",
        "create",
        "--db",
        str(tmp_path / "k.db"),
        "--org",
        "o",
        "--user",
        "u",
        "--role",
        "free",
        "--expires-in",
        "forever",
    )

    line = one_line_error(done)
    assert line.startswith("llmgw keys: --expires-in: not a duration: 'forever'"), line
    assert "float" not in line


def test_keys_list_has_a_header(tmp_path: Path) -> None:
    db = str(tmp_path / "k.db")
    created = llmgw(
        tmp_path, "keys", "create", "--db", db, "--org", "acme", "--user", "ann", "--role", "pro"
    )
    listed = llmgw(tmp_path, "keys", "list", "--db", db)

    assert created.returncode == 0, created.stderr
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == ["id", "prefix", "org/user", "role", "status"]
    assert row.split()[2:] == ["acme/ann", "pro", "active"]


def test_keys_without_a_named_database_refuse_rather_than_create_one(tmp_path: Path) -> None:
    create = llmgw(tmp_path, "keys", "create", "--org", "o", "--user", "u", "--role", "free")
    listing = llmgw(tmp_path, "keys", "list")

    for done in (create, listing):
        line = one_line_error(done)
        assert "--config FILE" in line, line
        assert "--db PATH" in line, line
    assert list(tmp_path.iterdir()) == []  # no stray database, no WAL beside it


async def test_keys_create_says_which_database_took_the_key(
    processes: list[GatewayProcess], tmp_path: Path
) -> None:
    await _serve(processes, tmp_path)  # serves ./llmgw.sqlite3, with its local socket
    offline_db = tmp_path / "offline.db"
    who = ("--org", "o", "--user", "u", "--role", "free")

    served = await asyncio.to_thread(llmgw, tmp_path, "keys", "create", *who)
    offline = await asyncio.to_thread(
        llmgw, tmp_path, "keys", "create", "--db", str(offline_db), *who, "--json"
    )

    assert served.returncode == 0, served.stderr
    first = served.stdout.splitlines()[0]
    assert first.endswith(f"through the gateway serving {tmp_path / 'llmgw.sqlite3'}"), first
    assert offline.returncode == 0, offline.stderr
    made = json.loads(offline.stdout)
    assert (made["via"], made["database"]) == ("file", str(offline_db))


async def test_keys_over_url_go_to_that_gateway_and_never_to_a_file(
    processes: list[GatewayProcess], tmp_path: Path
) -> None:
    env = {"LLMGW_ADMIN_KEY": "adm-e2e-keys-url"}
    proc = await _serve(processes, tmp_path, env=env)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    who = ("--org", "o", "--user", "u", "--role", "free", "--rpm", "7", "--json")

    created = await asyncio.to_thread(
        llmgw, elsewhere, "keys", "create", "--url", proc.url, *who, env=env
    )
    listed = await asyncio.to_thread(
        llmgw, elsewhere, "keys", "list", "--url", proc.url, "--json", env=env
    )

    assert created.returncode == 0, created.stderr
    made = json.loads(created.stdout)
    assert (made["via"], made["database"], made["limit_delivered"]) == ("url", "", "url")
    assert listed.returncode == 0, listed.stderr
    assert made["id"] in [row["id"] for row in json.loads(listed.stdout)]
    async with httpx.AsyncClient(base_url=proc.url, timeout=WAIT) as client:
        answer = await client.post(
            CHAT, json=chat("demo"), headers={"Authorization": f"Bearer {made['key']}"}
        )
    assert answer.status_code == 200, answer.text
    assert list(elsewhere.iterdir()) == []  # the CLI wrote no database of its own


def test_keys_over_an_unreachable_url_fail_without_touching_a_file(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening
        done = llmgw(
            tmp_path,
            *("keys", "create", "--url", dead, "--admin-key", "adm-x"),
            *("--org", "o", "--user", "u", "--role", "free"),
        )

    assert "not delivered" in one_line_error(done)
    assert list(tmp_path.iterdir()) == []


def test_keys_and_logs_need_only_the_database_of_the_config(tmp_path: Path) -> None:
    db = tmp_path / "gw.sqlite3"
    sqlite3.connect(db).close()
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "database": {"path": str(db)},
                "models": [
                    {
                        "id": "m",
                        "route": [
                            {
                                "kind": "openai_compat",
                                "base_url": "http://127.0.0.1:9/v1",
                                "api_key": "${LLMGW_E2E_UNSET_KEY}",
                            }
                        ],
                    }
                ],
            }
        )
    )
    assert "LLMGW_E2E_UNSET_KEY" not in os.environ

    keys = llmgw(tmp_path, "keys", "list", "--config", str(cfg))
    logs = llmgw(tmp_path, "logs", "--config", str(cfg))

    assert (keys.returncode, keys.stdout, keys.stderr) == (0, "no keys\n", "")
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.split()[:2] == ["time", "kind"]


def test_logs_beside_a_socket_left_by_a_killed_gateway_reads_the_database(
    tmp_path: Path,
) -> None:
    db = tmp_path / "gw.sqlite3"
    with sqlite3.connect(db) as conn:
        for stmt in (*REQUEST_LOG.statements, *missing_columns(set())):
            conn.execute(stmt)
        conn.execute(INSERT, request_row(RequestCompleted(request_id="r-before-kill", ts=1e9)))
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(yaml.safe_dump({"database": {"path": str(db)}}))
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(tmp_path / "gw.sqlite3.sock"))  # closed without unlinking, as after kill -9

    logs = llmgw(tmp_path, "logs", "--config", str(cfg), "--since", "100000d", "--json")

    assert logs.returncode == 0, logs.stderr
    assert [json.loads(r)["request_id"] for r in logs.stdout.splitlines()] == ["r-before-kill"]


def test_admin_on_a_dead_bus_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused

        done = llmgw(
            tmp_path, "admin", "show", "--bus", f"nats://127.0.0.1:{port}", "--timeout", "1"
        )

    line = one_line_error(done)
    assert line.startswith("llmgw admin: config show not delivered: cannot connect to NATS")


def test_admin_keeps_trying_a_dead_bus_for_its_whole_timeout(tmp_path: Path) -> None:
    """The bus refuses every attempt (accepts and hangs up); with ``--timeout 120`` the command
    is still trying long after the connect timeout it used to have (5 s, one attempt a
    second)."""
    attempts = threading.Semaphore(0)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def refuse() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                conn.close()
                attempts.release()

        threading.Thread(target=refuse, daemon=True).start()
        with subprocess.Popen(
            [LLMGW, "admin", "show", "--bus", f"nats://127.0.0.1:{port}", "--timeout", "120"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as proc:
            try:
                for n in range(10):
                    assert attempts.acquire(timeout=PROCESS_WAIT), f"gave up after {n} tries"
                    assert proc.poll() is None, proc.communicate()
            finally:
                proc.kill()
                proc.communicate()
                listener.close()


async def test_admin_over_url_prints_no_http_client_log_lines(
    processes: list[GatewayProcess],
    tmp_path: Path,
) -> None:
    env = {"LLMGW_ADMIN_KEY": "adm-e2e-operator"}
    proc = await _serve(processes, tmp_path, env=env)

    done = await asyncio.to_thread(llmgw, tmp_path, "admin", "show", "--url", proc.url, env=env)

    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert json.loads(done.stdout)["models"] == ["demo"]


async def test_a_socket_left_by_a_killed_gateway_is_replaced(
    processes: list[GatewayProcess], tmp_path: Path
) -> None:
    stale = tmp_path / "llmgw.sqlite3.sock"
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(stale))  # closed without unlinking, as after kill -9
    await _serve(processes, tmp_path)

    show = await asyncio.to_thread(llmgw, tmp_path, "admin", "show")

    assert show.returncode == 0, show.stderr
    assert stat.S_IMODE(stale.stat().st_mode) == 0o600


async def test_admin_routewise_settings_through_the_generic_cli_path(
    processes: list[GatewayProcess], tmp_path: Path
) -> None:
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "models": [
                    {
                        "id": "org/m",
                        "aliases": ["m"],
                        "router": "routewise",
                        "route": [{"kind": "echo"}, {"kind": "echo"}],
                    }
                ]
            }
        )
    )
    await _serve(processes, tmp_path, "--config", str(cfg))

    done = await asyncio.to_thread(
        llmgw,
        tmp_path,
        "admin",
        "routewise",
        "set_model_setting",
        "--arg",
        "model_id=m",
        "--arg",
        "key=budget_alpha",
        "--arg",
        "value=0.9",
    )
    shown = await asyncio.to_thread(
        llmgw, tmp_path, "admin", "routewise", "model_settings", "--arg", "model_id=org/m"
    )
    refused = await asyncio.to_thread(
        llmgw,
        tmp_path,
        "admin",
        "routewise",
        "set_model_setting",
        "--arg",
        "model_id=m",
        "--arg",
        "key=daily_quota",
        "--arg",
        "value=5",
    )

    assert done.returncode == 0, done.stderr
    setting = json.loads(shown.stdout)["settings"]["budget_alpha"]
    assert setting == {"value": 0.9, "source": "model_override"}
    assert refused.returncode == 1 and "daily_quota" in refused.stderr
