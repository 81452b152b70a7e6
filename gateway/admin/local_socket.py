"""The local operator socket: ``llmgw admin``/``logs``/``events`` on the gateway's own machine
with no admin key.

A process running the actors listens on a Unix socket beside its database,
``<database.path>.sock``, of mode 0600: only the user owning the gateway (who can read its
database anyway) may connect, so the file permission is the credential. It speaks the HTTP
admin API (``GET|POST /admin/<area>/<verb>``, ``GET /events``) as a thin client of the bus
commands, like an ingress's admin API, and each of its answers carries an ``x-request-id``
made as the ingress makes its own; the CLI finds it from ``--config``'s ``database.path``
(default ``llmgw.sqlite3``) when it is given no ``--bus`` or ``--url``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from gateway.admin.event_stream import kinds_of, since_of, stream_events
from gateway.admin.http import (
    ADMIN_TIMEOUT_S,
    admin_request,
    args_of,
    command_of,
    refuse_get_of_change,
)
from gateway.admin.http import PREFIX as ADMIN_PREFIX
from gateway.formats.openai_chat import error_body
from gateway.http.errors import error_code, error_headers, error_param, http_status
from gateway.http.request import HttpRequest, request_ids
from schemas import GatewayError, RouteNotFoundError

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from typing import Any

    from bus import Bus
    from gateway.http.request import Receive, Scope, Send

    ServeSocket = Callable[[Any, socket.socket, asyncio.Event], Coroutine[Any, Any, None]]
    """Serves an ASGI app on a listening socket it owns until the event is set."""

logger = logging.getLogger(__name__)

_encode = msgspec.json.Encoder().encode
_BY = "local-cli"  # who sent a command, in AdminExecuted events


def socket_path(database_path: str | Path) -> Path:
    """Where the gateway whose database is ``database_path`` answers its local operators."""
    db = Path(database_path)
    return db.with_name(db.name + ".sock")


def answers(path: Path) -> bool:
    """True when something accepts connections on the Unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def bind_owner_only(path: Path) -> socket.socket:
    """A listening Unix socket at ``path`` that only this user may open (mode 0600).

    Bound in a fresh 0700 directory, narrowed to 0600, then renamed into place (replacing a
    stale socket), so it is never reachable with wider permissions. Raises OSError: when a
    live gateway already answers at ``path``, ``path`` is not a socket, or binding fails.
    """
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise OSError(f"{path} exists and is not a socket")
        if answers(path):
            raise OSError(f"another gateway already answers on {path}")
    private = Path(tempfile.mkdtemp(prefix=".llmgw-", dir=path.parent))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(private / "s"))
        os.chmod(private / "s", 0o600)
        os.replace(private / "s", path)
        sock.listen(64)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return sock


class LocalAdminApp:
    """The ASGI app on the socket: the admin commands and the event stream, for its owner."""

    def __init__(self, bus: Bus, after_reload: Callable[[str | None], None] | None) -> None:
        self._bus = bus
        self._after_reload = after_reload
        self._ids = request_ids()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        elif scope["type"] == "http":
            # Every answer names its exchange (HttpRequest.start), as the ingress's do: the
            # answer, the event stream and each error alike.
            req = HttpRequest(scope, receive, send, request_id=next(self._ids))
            try:
                await self._handle(req)
            except GatewayError as err:
                # Its shape and headers the HTTP admin API's (a 503's Retry-After).
                status = http_status(err)
                body = error_body(status, err.message, code=error_code(err), param=error_param(err))
                await req.respond(status, body, error_headers(err))
            except Exception:
                logger.exception(
                    "unhandled error serving %s %s (%s)", req.method, req.path, req.request_id
                )
                if not req.started:
                    await req.respond(
                        500, error_body(500, "internal gateway error", code="internal")
                    )

    async def _handle(self, req: HttpRequest) -> None:
        if (req.method, req.path) == ("GET", "/events"):
            await stream_events(req, self._bus, kinds_of(req), since_of(req))
            return
        if req.method not in ("GET", "POST") or not req.path.startswith(ADMIN_PREFIX):
            raise RouteNotFoundError(
                f"no such path {req.path}; this socket serves /admin/<area>/<verb> and /events"
            )
        area, verb = command_of(req)
        refuse_get_of_change(req, area, verb)  # as the HTTP API: a GET may be sent again
        result = await admin_request(
            self._bus,
            area,
            verb,
            await args_of(req),
            by=_BY,
            timeout=ADMIN_TIMEOUT_S,
            request_id=req.request_id,
        )
        if (area, verb) == ("config", "reload") and self._after_reload is not None:
            self._after_reload(str(result.get("version", "")) or None)
        await req.respond(200, _encode(result))


class LocalAdmin:
    """Owns the socket: its listener task, and removing the file at shutdown."""

    def __init__(
        self, path: Path, inode: int, server: asyncio.Task[None], stop: asyncio.Event
    ) -> None:
        self.path = path
        self._inode = inode
        self._server = server
        self._stop = stop

    @classmethod
    def open(
        cls,
        bus: Bus,
        database_path: str,
        sync: Callable[[str | None], None] | None,
        serve: ServeSocket,
    ) -> LocalAdmin | None:
        """Listen beside ``database_path``; None (logged) when the socket cannot be made.

        ``sync``, when this process serves HTTP too, brings its ingress to a reloaded config
        version before the reload is answered, as its own admin API does. ``serve`` runs the
        HTTP server on the socket (the process's own, so none is imported here).
        """
        if database_path == ":memory:":  # no file to sit beside, nor to share with others
            logger.info("no local admin socket for an in-memory database")
            return None
        path = socket_path(database_path)
        try:
            sock = bind_owner_only(path)
            inode = path.stat().st_ino
        except OSError as exc:
            logger.warning("no local admin socket (use --bus or --url to administer): %s", exc)
            return None
        stop = asyncio.Event()
        server = asyncio.create_task(
            serve(LocalAdminApp(bus, sync), sock, stop), name="llmgw:local-admin"
        )
        logger.info("local admin socket: %s", path)
        return cls(path, inode, server, stop)

    async def aclose(self) -> None:
        """Stop listening and remove the socket file (unless another process replaced it)."""
        self._stop.set()
        try:
            await self._server
        except Exception as exc:  # stopping anyway: say why it did not stop cleanly
            logger.warning("local admin socket: %r", exc)
        with contextlib.suppress(OSError):
            if self.path.stat().st_ino == self._inode:
                self.path.unlink()


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        kind = (await receive())["type"]
        if kind == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif kind == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
