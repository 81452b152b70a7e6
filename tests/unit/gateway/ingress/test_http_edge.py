"""The edge's Hypercorn settings (the headers every answer carries, made once a second) and
its h11 connection (which heads are timed)."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

import h11
import pytest

from gateway.ingress.http_edge import EdgeConfig, _FramedConnection

if TYPE_CHECKING:
    from types import FrameType


async def test_response_headers_are_made_once_a_second_dated_by_the_wall_clock() -> None:
    now = [1_700_000_000.25]
    cfg = EdgeConfig()
    cfg.wall = lambda: now[0]
    try:
        first = cfg.response_headers("h11")
        date = (b"date", b"Tue, 14 Nov 2023 22:13:20 GMT")
        assert first == [date, (b"server", b"hypercorn-h11")]
        now[0] = 1_700_000_000.9
        assert cfg.response_headers("h11") is first  # the same second's, not made again
        assert cfg.response_headers("h2") == [date, (b"server", b"hypercorn-h2")]
        # The first answer armed one timer, for the turn of the second.
        ticker = cfg.stamped._ticker
        assert ticker is not None
        loop = asyncio.get_running_loop()
        assert ticker.when() - loop.time() == pytest.approx(0.75, abs=0.05)
        now[0] = 1_700_000_001.0
        cfg.stamped.tick()  # what the timer runs at the turn
        assert cfg.response_headers("h11")[0] == (b"date", b"Tue, 14 Nov 2023 22:13:21 GMT")
        assert cfg.response_headers("h2")[0] == (b"date", b"Tue, 14 Nov 2023 22:13:21 GMT")
        assert cfg.stamped._ticker is not None and cfg.stamped._ticker is not ticker
        assert ticker.when() < cfg.stamped._ticker.when()
    finally:
        cfg.stamped.stop()
    assert cfg.stamped._ticker is None
    # Stopped (the server is done): still answered, nothing kept, no timer armed again.
    assert cfg.response_headers("h11")[1] == (b"server", b"hypercorn-h11")
    assert not cfg.stamped and cfg.stamped._ticker is None


def test_response_headers_run_no_python_code_once_made() -> None:
    # Read for every answer by Hypercorn: a C dict lookup while the second lasts.
    cfg = EdgeConfig()
    cfg.stamped["h11"] = [(b"server", b"hypercorn-h11")]
    calls: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            calls.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        headers = cfg.response_headers("h11")
    finally:
        sys.setprofile(None)
    assert headers == [(b"server", b"hypercorn-h11")]
    assert calls == []


def test_response_headers_outside_an_event_loop_are_made_each_time() -> None:
    cfg = EdgeConfig()
    assert cfg.response_headers("h11")[1] == (b"server", b"hypercorn-h11")
    assert not cfg.stamped


def _connection() -> tuple[_FramedConnection, list[bytes]]:
    begun: list[bytes] = []
    conn = _FramedConnection(h11.SERVER)
    conn.head_begun = begun.append
    return conn, begun


def test_a_head_that_arrives_whole_is_never_timed() -> None:
    # The head timer is armed only for a head still arriving: a request whose head comes
    # in one read (nearly all of them) costs no timer.
    conn, begun = _connection()
    conn.receive_data(b"GET /health HTTP/1.1\r\nhost: llmgw\r\n\r\n")
    assert isinstance(conn.next_event(), h11.Request)
    assert begun == []


def test_a_head_begun_alone_or_behind_an_answer_is_timed() -> None:
    conn, begun = _connection()
    conn.receive_data(b"GET /health HTTP/1.1\r\nho")
    assert conn.next_event() is h11.NEED_DATA
    assert begun == [b"GET /health HTTP/1.1\r\nho"]
    conn.receive_data(b"st: llmgw\r\n\r\nGET /next HTTP/1.1\r\nhost: ll")  # one pipelined
    assert isinstance(conn.next_event(), h11.Request)
    assert conn.next_event() == h11.EndOfMessage()
    assert conn.next_event() is h11.PAUSED  # not read while the first is being answered
    conn.send(h11.Response(status_code=204, headers=[]))
    conn.send(h11.EndOfMessage())
    conn.start_next_cycle()
    assert conn.next_event() is h11.NEED_DATA
    assert begun[1:] == [b"GET /next HTTP/1.1\r\nhost: ll"]
