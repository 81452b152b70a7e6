"""SSEParser: frames split anywhere still come out whole and in order."""

from __future__ import annotations

from gateway.adapters.sse import SSEParser

STREAM = b'event: a\ndata: {"x": 1}\n\n: comment\ndata: line1\ndata: line2\n\r\ndata: [DONE]\n\n'


def test_sse_parser_fed_whole_stream_yields_every_frame() -> None:
    assert SSEParser().feed(STREAM) == [
        ("a", b'{"x": 1}'),
        (None, b"line1\nline2"),
        (None, b"[DONE]"),
    ]


def test_sse_parser_fed_byte_by_byte_yields_the_same_frames() -> None:
    p = SSEParser()
    out = []
    for i in range(len(STREAM)):
        out.extend(p.feed(STREAM[i : i + 1]))
    assert out == SSEParser().feed(STREAM)
