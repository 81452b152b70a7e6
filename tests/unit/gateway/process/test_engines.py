"""The listening socket handed to granian: the connections it accepts must not wait on Nagle
(a streamed answer's small writes otherwise stall on the client's delayed ACK)."""

from __future__ import annotations

import socket

from gateway.process.engines import without_nagle


def _accepted(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    return client, server


def test_connections_accepted_from_the_granian_listener_have_nodelay() -> None:
    with socket.socket() as listener:
        client, server = _accepted(without_nagle(listener))
        with client, server:
            assert server.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_a_plain_listener_accepts_connections_with_nagle_on() -> None:
    # What the fix relies on: the option comes from the listener, not the kernel's default.
    with socket.socket() as listener:
        client, server = _accepted(listener)
        with client, server:
            assert not server.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
