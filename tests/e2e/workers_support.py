"""The harness of the ``llmgw serve --workers N`` tests: the supervisor as a child process,
its stderr followed line by line, and what a test asks of the processes it started."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

import httpx
import yaml

from tests.e2e.conftest import CHAT, WAIT, chat
from tests.fixtures.gateway import REPO

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping
    from pathlib import Path

# Fresh connections until both workers have answered: the chance that this many all land on
# one of two SO_REUSEPORT sockets is 2**-63.
TRIES = 64
SERVING = re.compile(r"worker (\d+) serving \(pid (\d+)\)")


class Supervisor:
    """``llmgw serve --workers N`` as a child process, its stderr followed line by line."""

    def __init__(
        self,
        cfg: Path,
        workers: int = 2,
        *,
        session: bool = False,
        port: int = 0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.cfg = cfg
        self._session = session  # its own session and process group, as under a terminal
        self._env = None if env is None else dict(env)
        self._args = ["serve", "--workers", str(workers), "--port", str(port), "--config", str(cfg)]
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.lines: list[str] = []
        self._new: asyncio.Queue[str | None] = asyncio.Queue()
        self._follower: threading.Thread | None = None

    async def start(self) -> Supervisor:
        """Spawn and return once the ready line is out. Raises RuntimeError if it exits."""
        self.spawn()
        if await self.ready() is None:
            raise RuntimeError("no ready line; stderr:\n" + "\n".join(self.lines))
        return self

    def spawn(self) -> None:
        """Start the process (and the thread following its stderr); return at once."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli.main", *self._args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=self._session,
            env=self._env,
        )
        loop = asyncio.get_running_loop()
        self._follower = threading.Thread(target=self._follow, args=(loop,), daemon=True)
        self._follower.start()

    async def ready(self) -> str | None:
        """Its URL once the ready line is out; None when its stdout ends without one."""
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.to_thread(self.proc.stdout.readline)
        if not line.startswith("llmgw listening on http://"):
            return None
        self.url = line.strip().rsplit(" ", 1)[-1]
        return self.url

    def _follow(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            loop.call_soon_threadsafe(self._new.put_nowait, raw.rstrip())
        loop.call_soon_threadsafe(self._new.put_nowait, None)

    async def line(self, pattern: re.Pattern[str]) -> re.Match[str]:
        """The next stderr line matching ``pattern`` (earlier lines are kept in ``lines``)."""
        async with asyncio.timeout(WAIT * 3):
            while True:
                line = await self._new.get()
                if line is None:
                    raise AssertionError("the supervisor ended; stderr:\n" + "\n".join(self.lines))
                self.lines.append(line)
                match = pattern.search(line)
                if match:
                    return match

    async def rest(self) -> None:
        """Read stderr to its end (every process writing it gone) into ``lines``."""
        async with asyncio.timeout(WAIT * 3):
            while (line := await self._new.get()) is not None:
                self.lines.append(line)

    def seen(self, pattern: re.Pattern[str]) -> re.Match[str]:
        """The first stderr line read so far that matches ``pattern``."""
        return next(m for line in self.lines if (m := pattern.search(line)))

    def worker_pids(self) -> set[int]:
        """Every worker pid the supervisor has reported serving so far."""
        return {int(m.group(2)) for line in self.lines if (m := SERVING.search(line))}

    async def exited(self) -> int:
        """Its exit code, once it has exited (within WAIT * 3 seconds)."""
        assert self.proc is not None
        return await asyncio.to_thread(self.proc.wait, WAIT * 3)

    async def stop(self) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.to_thread(self.proc.wait, WAIT * 3)

    async def close(self) -> None:
        """Stop it if it still runs (SIGKILL if SIGTERM does not do), and release the pipes
        and the thread reading them."""
        assert self.proc is not None
        try:
            await self.stop()
        except subprocess.TimeoutExpired:
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait)
        if self._follower is not None:
            await asyncio.to_thread(self._follower.join, WAIT)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@contextlib.asynccontextmanager
async def supervised() -> AsyncIterator[list[Supervisor]]:
    """A list for the supervisors a test starts; each is closed at the end (stopped if the
    test left it running). Each test module's ``supervisors`` fixture."""
    started: list[Supervisor] = []
    try:
        yield started
    finally:
        for sup in started:
            await sup.close()


async def start_run(
    supervisors: list[Supervisor], tmp_path: Path, cfg: dict[str, Any], *, session: bool = False
) -> Supervisor:
    """A supervisor of two workers serving ``cfg`` (its database in ``tmp_path``), once both
    workers serve; it joins ``supervisors`` (closed at the test's end)."""
    path = tmp_path / "gw.yaml"
    cfg = {"database": {"path": str(tmp_path / "gw.sqlite3")}, **cfg}
    path.write_text(yaml.safe_dump(cfg))
    sup = Supervisor(path, session=session)
    supervisors.append(sup)
    await sup.start()
    while len(sup.worker_pids()) < 2:  # both were logged before the ready line
        await sup.line(SERVING)
    return sup


def pid_of(headers: Mapping[str, str]) -> int:
    """The process that answered: the gateway's request ids start with its pid in hex."""
    return int(headers["x-request-id"].split("-", 1)[0], 16)


async def health_pid(url: str) -> int:
    """The process answering ``GET /health`` on a fresh connection."""
    async with httpx.AsyncClient(base_url=url, timeout=WAIT) as fresh:
        resp = await fresh.get("/health")
    assert resp.status_code == 200
    return int(resp.json()["pid"])


async def dead(pid: int) -> None:
    """Return once process ``pid`` has ended (its pidfd becomes readable)."""
    with contextlib.suppress(ProcessLookupError):
        fd = os.pidfd_open(pid)
        try:
            ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def readable() -> None:
                # A pidfd stays readable: the reader may run again before it is removed.
                if not ended.done():
                    ended.set_result(None)

            asyncio.get_running_loop().add_reader(fd, readable)
            try:
                await asyncio.wait_for(ended, WAIT)
            finally:
                asyncio.get_running_loop().remove_reader(fd)
        finally:
            os.close(fd)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def replace_a_worker(sup: Supervisor, live: set[int]) -> set[int]:
    """SIGKILL one of the ``live`` workers; the live ones once its replacement serves."""
    victim = min(live)
    os.kill(victim, signal.SIGKILL)
    await dead(victim)
    replacement = int((await sup.line(SERVING)).group(2))
    return (live - {victim}) | {replacement}


async def served(sup: Supervisor, pids: set[int], model_id: str) -> set[int]:
    """Which of ``pids`` answer ``model_id`` with a 200, asked on fresh connections (so either
    worker) until all have or the time is up (a reload reaches each worker on its own)."""
    found: set[int] = set()
    deadline = asyncio.get_running_loop().time() + WAIT
    while found != pids and asyncio.get_running_loop().time() < deadline:
        async with httpx.AsyncClient(base_url=sup.url, timeout=WAIT) as fresh:
            resp = await fresh.post(CHAT, json=chat(model_id))
        if resp.status_code == 200:
            found.add(pid_of(resp.headers))
    return found


async def served_by(sup: Supervisor, count: int, model_id: str) -> set[int]:
    """The processes that answer ``model_id`` with a 200, asked on fresh connections until
    ``count`` have or the time is up."""
    found: set[int] = set()
    deadline = asyncio.get_running_loop().time() + WAIT
    while len(found) < count and asyncio.get_running_loop().time() < deadline:
        async with httpx.AsyncClient(base_url=sup.url, timeout=WAIT) as fresh:
            resp = await fresh.post(CHAT, json=chat(model_id))
        if resp.status_code == 200:
            found.add(pid_of(resp.headers))
    return found


async def refused(url: str) -> None:
    """Return once a connection to ``url`` is refused (no worker listening)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    async with asyncio.timeout(WAIT):
        while True:
            try:
                _, writer = await asyncio.open_connection(host, int(port))
            except ConnectionRefusedError:
                return
            except ConnectionResetError:
                pass  # queued on a socket that closed: ask again
            else:
                writer.close()
                await writer.wait_closed()
            await asyncio.sleep(0.01)  # polled: a worker's stop has no observable event
