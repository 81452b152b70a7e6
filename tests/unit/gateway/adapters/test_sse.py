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


def test_sse_parser_takes_plain_data_frames_whole_and_the_rest_line_by_line() -> None:
    stream = (
        b'data: {"a": 1}\n\ndata:{"b": 2}\n\nevent: e\ndata: x\n\ndata: cr\r\n\r\ndata: [DONE]\n\n'
    )
    expected = [
        (None, b'{"a": 1}'),
        (None, b'{"b": 2}'),
        ("e", b"x"),
        (None, b"cr"),
        (None, b"[DONE]"),
    ]
    assert SSEParser().feed(stream) == expected
    for cut in range(len(stream) + 1):
        p = SSEParser()
        assert p.feed(stream[:cut]) + p.feed(stream[cut:]) == expected, cut
