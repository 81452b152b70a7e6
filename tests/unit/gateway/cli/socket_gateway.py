"""A stand-in for a gateway on the local socket beside a database: a real HTTP server on the
real Unix socket, answering each admin command as a gateway in a given state does (its bus
reconnecting, its owner silent), or not at all while ``hold`` is clear."""

from __future__ import annotations

import json
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from gateway.admin.local_socket import socket_path

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

LOST = "the gateway has lost its connection to its message bus (NATS) and is reconnecting"
SILENT = "the control plane did not answer within 30s"


class FakeGateway(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """``answer`` (status, code, message) for every command; ``made``, when set, the answer
    to ``api_keys create``; ``paths`` those asked; nothing is answered while ``hold`` is
    clear; with ``drop`` the connection is closed once the command is read (a gateway that
    died running it)."""

    # Each command's thread is joined at close, so none writes into the next test's output.
    daemon_threads = False
    block_on_close = True
    answer: tuple[int, str, str]
    made: dict[str, Any] | None
    paths: list[str]
    hold: threading.Event
    drop: bool

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A command held past the client's timeout is answered into a connection it closed.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: FakeGateway

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.server.paths.append(self.path)
        self.server.hold.wait()
        if self.server.drop:
            self.close_connection = True
            return
        status, code, message = self.server.answer
        body = json.dumps({"error": {"message": message, "code": code}}).encode()
        if self.server.made is not None and self.path == "/admin/api_keys/create":
            status, body = 200, json.dumps(self.server.made).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serving(database: Path) -> Iterator[FakeGateway]:
    """A gateway on ``database``'s socket that refuses every admin command as one whose bus
    is lost does (set ``answer`` for another refusal); stopped when the caller is done."""
    server = FakeGateway(str(socket_path(database)), _Handler)
    server.answer, server.made, server.paths = (503, "no_responders", LOST), None, []
    server.hold = threading.Event()
    server.hold.set()
    server.drop = False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.hold.set()  # a command held is answered, so that the server can stop
        server.shutdown()
        server.server_close()
        thread.join()
