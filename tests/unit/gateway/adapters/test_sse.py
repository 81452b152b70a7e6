"""SSEParser: frames split anywhere still come out whole and in order."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import pytest

from gateway.adapters.sse import MAX_EVENT_BYTES, SSEParser
from schemas import UpstreamBadResponseError

if TYPE_CHECKING:
    from types import FrameType

MIB = 1024 * 1024

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


MIXED = b"event: a\ndata: 1\n\n: note\ndata: 2\ndata: 3\n\ndata: [DONE]\n\n"
MIXED_FRAMES = [("a", b"1"), (None, b"2\n3"), (None, b"[DONE]")]


def _fed(parser: SSEParser, reads: list[bytes]) -> list[tuple[str | None, bytes]]:
    return [frame for read in reads for frame in parser.feed(read)]


def test_sse_parser_ends_lines_at_lf_crlf_or_cr_alone_cut_anywhere() -> None:
    # The SSE specification's three line ends, and each line ending its own way; a CR closing
    # one read and a LF opening the next is one line end, not two (an empty line).
    streams = [MIXED, MIXED.replace(b"\n", b"\r\n"), MIXED.replace(b"\n", b"\r")]
    streams.append(b"event: a\r\ndata: 1\r\r: note\ndata: 2\rdata: 3\n\r\ndata: [DONE]\r\n\n")
    streams.append(b"event: a\rdata: 1\n\r\n: note\r\ndata: 2\ndata: 3\r\n\rdata: [DONE]\n\r")
    for stream in streams:
        for i in range(len(stream) + 1):
            for j in range(i, len(stream) + 1):
                reads = [stream[:i], stream[i:j], stream[j:]]
                assert _fed(SSEParser(), reads) == MIXED_FRAMES, (stream, i, j)


def test_sse_parser_takes_a_crlf_cut_between_two_reads_as_one_line_end() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\r") == []
    assert p.feed(b"\ndata: b\r") == []  # an empty line here would have ended the event at a
    assert p.feed(b"\n\r") == [(None, b"a\nb")]  # the CR alone is the empty line
    assert p.feed(b"\n") == []  # the LF of that CRLF: no second empty line
    assert p.feed(b"data: c\r\r") == [(None, b"c")]
    assert p.feed(b"") == []
    assert p.feed(b"\ndata: d\n\n") == [(None, b"d")]


def test_sse_parser_takes_a_bare_cr_in_a_data_line_as_its_end() -> None:
    # As the specification reads it (browsers too): the line ends at the CR, and "b" is a
    # field of its own, unknown, so ignored.
    assert SSEParser().feed(b"data: a\rb\n\n") == [(None, b"a")]


def _scanned(parser: SSEParser, read: bytes) -> tuple[list[tuple[str | None, bytes]], int]:
    """What ``parser.feed(read)`` returned, and the length of every bytes object whose method
    it called (a ``find``, ``split``, ``count``...): a bound on the bytes it scanned."""
    scanned = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal scanned
        if event == "c_call" and isinstance(getattr(arg, "__self__", None), bytes):
            scanned += len(arg.__self__)

    sys.setprofile(profile)
    try:
        frames = parser.feed(read)
    finally:
        sys.setprofile(None)
    return frames, scanned


def test_sse_parser_scans_a_big_event_arriving_in_many_reads_a_few_times_only() -> None:
    # Each read was added to all that was pending and the whole split again: 8 MiB in 64 KiB
    # reads made some 260 times 8 MiB of calls (and 50 MiB without a line end blocked the
    # event loop for seconds). Now a read that ends no line is held, what precedes untouched.
    payload = b'{"arguments": "' + b"y" * (8 * MIB) + b'"}'
    stream = b"data: " + payload + b"\n\n"
    parser = SSEParser()
    frames: list[tuple[str | None, bytes]] = []
    scanned = 0
    for i in range(0, len(stream), 64 * 1024):
        got, n = _scanned(parser, stream[i : i + 64 * 1024])
        frames += got
        scanned += n
    assert frames == [(None, payload)]
    assert 0 < scanned <= 8 * len(stream), scanned / len(stream)


def _too_large(parser: SSEParser, reads: list[bytes]) -> UpstreamBadResponseError:
    with pytest.raises(UpstreamBadResponseError) as caught:
        for read in reads:
            parser.feed(read)
    return caught.value


@pytest.mark.parametrize(
    "line", [b"y" * MIB, b"y" * (MIB - 6) + b"\ndata: ", b"y" * (MIB - 6) + b"\rdata: "]
)
def test_sse_parser_with_an_event_open_past_the_bound_raises_bad_response(line: bytes) -> None:
    # One endless line, or many data lines never ending the event (LF or CR ended): either
    # way the event held grows past the bound.
    parser = SSEParser("m:up")
    assert parser.feed(b"data: a\n\ndata: ") == [(None, b"a")]
    err = _too_large(parser, [line] * 17)
    assert err.kind == "bad_response" and err.endpoint == "m:up", err
    assert "invalid response" in str(err) and str(MAX_EVENT_BYTES) in str(err), err


def test_sse_parser_holds_an_open_event_of_the_bound_and_not_one_byte_more() -> None:
    # Checked on what a read leaves open: an event the same read ends may pass the bound
    # by at most that read (256 KiB), which bounds memory as well.
    open_at_bound = b"data: " + b"y" * (MAX_EVENT_BYTES - 6)
    parser = SSEParser()
    assert parser.feed(open_at_bound) == []
    assert parser.feed(b"\n\n") == [(None, b"y" * (MAX_EVENT_BYTES - 6))]
    assert parser.feed(open_at_bound[: 2 * MIB]) == []
    assert parser.feed(open_at_bound[2 * MIB :]) == []
    assert _too_large(parser, [b"y"]).kind == "bad_response"
