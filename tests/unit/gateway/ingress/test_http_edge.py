"""The edge's Hypercorn settings (the headers every answer carries, made once a second) and
its h11 connection (which heads are timed)."""

from __future__ import annotations

import h11

from gateway.ingress.http_edge import EdgeConfig, _FramedConnection


def test_response_headers_are_made_once_a_second_dated_by_the_wall_clock() -> None:
    now = [1_700_000_000.2]
    cfg = EdgeConfig()
    cfg.wall = lambda: now[0]
    first = cfg.response_headers("h11")
    assert first == [(b"date", b"Tue, 14 Nov 2023 22:13:20 GMT"), (b"server", b"hypercorn-h11")]
    now[0] = 1_700_000_000.9
    again = cfg.response_headers("h11")
    assert again == first and again is not first  # a caller may extend its own list
    assert again[0][1] is first[0][1]  # the same second's date is not formatted again
    now[0] = 1_700_000_001.0
    assert cfg.response_headers("h11")[0] == (b"date", b"Tue, 14 Nov 2023 22:13:21 GMT")
    assert cfg.response_headers("h2")[1] == (b"server", b"hypercorn-h2")


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
