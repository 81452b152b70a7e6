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


def test_sse_parser_reads_a_read_of_plain_frames_as_the_line_by_line_path_does() -> None:
    # Each read is taken whole when all its frames are single ``data:`` lines; the edges
    # (no space, two spaces, empty data, a third line end, a CR, a trailing partial line)
    # must come out as the line-by-line reading gives them.
    cases = {
        b"data:x\n\ndata:  two\n\ndata:\n\n": [(None, b"x"), (None, b" two"), (None, b"")],
        b"data: a\n\n\ndata: b\n\n": [(None, b"a"), (None, b"b")],
        b"data: a\n\n\n\n": [(None, b"a")],
        b"data: a\r\n\r\ndata: b\n\n": [(None, b"a"), (None, b"b")],
        b"data: a\n\ndata: b\ndata: c\n\n": [(None, b"a"), (None, b"b\nc")],
        b"data: a\n\nevent: e\ndata: b\n\n": [(None, b"a"), ("e", b"b")],
        b"data: a\n\ndata\n\n": [(None, b"a"), (None, b"")],
    }
    for stream, expected in cases.items():
        assert SSEParser().feed(stream) == expected, stream
        for cut in range(len(stream) + 1):
            p = SSEParser()
            assert p.feed(stream[:cut]) + p.feed(stream[cut:]) == expected, (stream, cut)
    p = SSEParser()
    assert p.feed(b"data: a\n\ndata: b\n") == [(None, b"a")]  # b's line read, its frame open
    assert p.feed(b"data: c\n\n") == [(None, b"b\nc")]
