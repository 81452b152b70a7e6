"""The edge's Hypercorn settings: the headers every answer carries, made once a second."""

from __future__ import annotations

from gateway.ingress.http_edge import EdgeConfig


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
