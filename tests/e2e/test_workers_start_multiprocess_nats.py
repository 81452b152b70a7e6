"""``llmgw serve --workers 2`` while it starts: what ends a start, and what may not.

Two runs started at the same moment on one port: one serves, the other refuses in one line
(SO_REUSEPORT would have let both join the port, each taking half its connections). A bus
that drops between a worker joining it and answering: the worker says so in one line and
exits, and the supervisor starts another once the bus is back (an external NATS server), or
stops the run with its reason (its own nats-server killed). SIGTERM while workers start ends
the run at once. The window between a worker joining the bus and answering is held open by
``tests/fixtures/held_start`` (the worker waits for SIGUSR1 there).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import tempfile
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from gateway.admin.local_socket import socket_path
from tests.e2e.conftest import WAIT, config, model, route
from tests.e2e.workers_support import (
    TRIES,
    Supervisor,
    alive,
    dead,
    health_pid,
    served_by,
    supervised,
)
from tests.fixtures.gateway import REPO
from tests.fixtures.nats import start_nats_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.fixtures.upstream import FakeUpstream

# Each starts a supervisor or two and may wait out a subscription's 5 s confirmation timeout
# and a NATS server's restart: more than the suite's 60 s on a loaded machine.
pytestmark = [pytest.mark.e2e, pytest.mark.nats, pytest.mark.timeout(120)]


@pytest.fixture
async def supervisors() -> AsyncIterator[list[Supervisor]]:
    """Supervisors a test started; closed at teardown (stopped if the test left one running)."""
    async with supervised() as started:
        yield started


_HOOK = REPO / "tests" / "fixtures" / "held_start"
_HELD = re.compile(r"held for the test \(pid (\d+)\)")
_LOST = re.compile(r"ERROR worker \d \(pid (\d+)\) llmgw: stopping: lost the bus while starting")
_EMBEDDED = re.compile(r"embedded nats-server \(pid (\d+)\)")


def _write(tmp_path: Path, cfg: dict[str, Any]) -> Path:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump({"database": {"path": str(tmp_path / "gw.sqlite3")}, **cfg}))
    return path


def _held_env() -> dict[str, str]:
    """The environment of a supervisor whose workers hold their start (tests/fixtures/
    held_start) until each gets SIGUSR1."""
    path = os.pathsep.join(p for p in (str(_HOOK), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "LLMGW_TEST_HOLD_WORKERS": "1"}


async def _held(sup: Supervisor, count: int = 2) -> set[int]:
    """The pids of the next ``count`` workers to hold their start."""
    return {int((await sup.line(_HELD)).group(1)) for _ in range(count)}


async def _held_start(
    tmp_path: Path, up: FakeUpstream, supervisors: list[Supervisor]
) -> tuple[Supervisor, set[int]]:
    """A run of one model on ``up`` whose two workers hold their start; it and their pids."""
    sup = Supervisor(_write(tmp_path, config(model("m", route(up)))), env=_held_env())
    supervisors.append(sup)
    sup.spawn()
    return sup, await _held(sup)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _traceback(sup: Supervisor) -> bool:
    return any("Traceback" in line for line in sup.lines)


async def test_two_runs_started_at_once_on_one_port_one_serves_and_the_other_refuses(
    tmp_path: Path, fake_upstream: FakeUpstream, supervisors: list[Supervisor]
) -> None:
    # Both passed the check that nothing listens on the port (neither's workers did yet),
    # then both workers' SO_REUSEPORT sockets joined it: each run took half the connections.
    port = _free_port()
    runs = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        path = _write(tmp_path / name, config(model("m", route(fake_upstream))))
        runs.append(Supervisor(path, port=port))
    supervisors.extend(runs)
    for sup in runs:
        sup.spawn()  # at once: neither waits for the other's start

    urls = await asyncio.gather(*(sup.ready() for sup in runs))
    serving = [sup for sup, url in zip(runs, urls, strict=True) if url is not None]
    assert len(serving) == 1, f"{len(serving)} runs serve port {port}"
    (winner,) = serving
    (loser,) = [sup for sup in runs if sup is not winner]
    code = await loser.exited()
    await loser.rest()
    while len(winner.worker_pids()) < 2:  # both logged before its ready line
        await winner.line(re.compile(r"worker \d serving"))
    answered = {await health_pid(winner.url) for _ in range(TRIES)}

    assert code == 2, "\n".join(loser.lines)
    assert loser.lines[-1].startswith(f"llmgw: cannot listen on 127.0.0.1:{port}: ")
    assert "Address already in use" in loser.lines[-1]
    assert not _traceback(loser)
    assert answered == winner.worker_pids()  # every connection reached the one run


async def test_an_external_bus_lost_while_workers_start_they_exit_in_one_line_and_others_serve(
    tmp_path: Path, fake_upstream: FakeUpstream, supervisors: list[Supervisor]
) -> None:
    # A worker whose bus dropped after it joined and before it answered printed a traceback
    # (its app's start could not subscribe), or hung in its wait for /health, SIGTERM
    # included. It says why in one line and exits; the supervisor starts another, which waits
    # for the bus, and the run serves once the bus is back.
    with ExitStack() as stack:
        url = stack.enter_context(start_nats_server())
        path = _write(tmp_path, config(model("m", route(fake_upstream)), bus={"url": url}))
        sup = Supervisor(path, env=_held_env())
        supervisors.append(sup)
        sup.spawn()
        first = await _held(sup)
        stack.close()  # the NATS server goes down
        for pid in first:
            os.kill(pid, signal.SIGUSR1)
        lost = {int((await sup.line(_LOST)).group(1)) for _ in first}
        await sup.line(re.compile(r"waiting for the bus to come back"))
        stack.enter_context(start_nats_server(port=int(url.rsplit(":", 1)[1])))
        second = await _held(sup)  # the workers started again, on the bus again
        for pid in second:
            os.kill(pid, signal.SIGUSR1)
        ready = await sup.ready()
        served = await served_by(sup, 2, "m")
        code = await sup.stop()
        await sup.rest()

    said = "\n".join(sup.lines)
    assert lost == first, said
    assert ready is not None and served == second, said
    assert code == 0, said
    assert not _traceback(sup), said
    # One line each: the reason, not the exceptions it came through.
    assert len([line for line in sup.lines if _LOST.search(line)]) == 2, said


async def test_the_embedded_nats_server_killed_while_workers_start_stops_the_run_at_once(
    tmp_path: Path, fake_upstream: FakeUpstream, supervisors: list[Supervisor]
) -> None:
    # The supervisor waited for the workers' ready lines (60 s) before it looked at its
    # nats-server, and each held worker waited for /health with no bound, SIGTERM included.
    sup, workers = await _held_start(tmp_path, fake_upstream, supervisors)
    nats = int(sup.seen(_EMBEDDED).group(1))
    os.kill(nats, signal.SIGKILL)
    async with asyncio.timeout(WAIT):
        code = await sup.exited()
    await sup.rest()

    said = "\n".join(sup.lines)
    assert code == 1, said
    reason = re.compile(rf"ERROR llmgw: stopping: the embedded nats-server \(pid {nats}\) exited")
    assert sup.seen(reason), said
    assert not _traceback(sup), said
    assert not [pid for pid in workers if alive(pid)]
    assert sup.proc is not None
    run = re.compile(rf"llmgw-\w+-{sup.proc.pid}-")  # its nats and metrics temp dirs
    assert not [name for name in os.listdir(tempfile.gettempdir()) if run.match(name)]


async def test_sigterm_while_the_workers_start_stops_the_run_at_once_and_clean(
    tmp_path: Path, fake_upstream: FakeUpstream, supervisors: list[Supervisor]
) -> None:
    # SIGINT/SIGTERM were only looked at once every worker answered: a start that waited (a
    # bus down, a slow machine) could not be stopped.
    sup, workers = await _held_start(tmp_path, fake_upstream, supervisors)
    nats = int(sup.seen(_EMBEDDED).group(1))
    async with asyncio.timeout(WAIT):
        code = await sup.stop()
    await sup.rest()

    said = "\n".join(sup.lines)
    assert code == 0, said
    assert await sup.ready() is None  # no ready line: it never served
    assert not _traceback(sup), said
    assert not [pid for pid in (*workers, nats) if alive(pid)]
    assert not socket_path(tmp_path / "gw.sqlite3").exists()


async def test_a_supervisor_killed_while_its_workers_start_leaves_none_behind(
    tmp_path: Path, fake_upstream: FakeUpstream, supervisors: list[Supervisor]
) -> None:
    # A worker orphaned before it answered noticed its stdin's end, but its wait for /health
    # did not look: it stayed, holding the port, until killed by hand.
    sup, workers = await _held_start(tmp_path, fake_upstream, supervisors)
    assert sup.proc is not None
    sup.proc.kill()
    async with asyncio.timeout(WAIT):
        for pid in workers:
            await dead(pid)
    await sup.rest()

    assert not _traceback(sup), "\n".join(sup.lines)
