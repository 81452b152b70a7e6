"""A chunked body is framed the same whatever reads it arrives in: whole in one read (where
whole chunks are taken in a few calls, ``http1._whole_chunks``), cut in two anywhere, or one
byte at a time (the framing loop alone). Random bodies: data with and without CRLFs inside,
sizes in either case, with leading zeros, extensions or signs, trailers, a cut end, a wrong
size."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.adapters.http1 import WAITING_HEAD, Http1Connection

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"

_DATA = st.one_of(
    st.binary(min_size=1, max_size=40),
    st.sampled_from([b'data: {"a":1}\n\n', b"data: x\r\n\r\n", b"\r\n", b"0\r\n", b"\r"]),
)


_FLAWS = ("none", "none", "size", "extension", "sign", "underscore", "long", "trailer", "cut")


@st.composite
def chunked_bodies(draw: st.DrawFn) -> bytes:
    """A chunked body as servers send them, or with one flaw (in one chunk): a size one off,
    an extension or padding, a sign, an underscore or 17 digits in a size (``int()`` takes
    them, HTTP does not), a trailer, a cut end."""
    flaw = draw(st.sampled_from(_FLAWS))
    datas = draw(st.lists(_DATA, min_size=1, max_size=8))
    flawed = draw(st.integers(0, len(datas) - 1))
    out = []
    for i, data in enumerate(datas):
        here = flaw if i == flawed else "none"
        size = len(data) + (draw(st.sampled_from([1, -1])) if here == "size" else 0)
        digits = f"{max(size, 1):x}"
        digits = draw(st.sampled_from([digits, digits.upper(), "0" + digits]))
        odd = {"sign": "+" + digits, "underscore": "0_" + digits, "long": digits.zfill(17)}
        digits = odd.get(here, digits)
        ext = draw(st.sampled_from([b";ext=1", b" "])) if here == "extension" else b""
        out.append(digits.encode() + ext + b"\r\n" + data + b"\r\n")
    end = b"0\r\nx-t: 1\r\n\r\n" if flaw == "trailer" else b"0\r\n\r\n"
    body = b"".join(out) + end
    return body[: draw(st.integers(0, len(body) - 1))] if flaw == "cut" else body


def _framed(reads: list[bytes], loop: asyncio.AbstractEventLoop) -> tuple[bool, bool, bytes]:
    """(failed, complete, the body's data) after ``reads`` arrive on a fresh connection."""
    conn = Http1Connection(loop, ("http", "h", 80), set())
    conn.state = WAITING_HEAD  # as a request sent on it leaves it
    for data in reads:
        if not conn.closed:
            conn.data_received(data)
    failed = conn.error is not None
    return failed, conn.complete, b"" if failed else b"".join(conn.pieces)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=chunked_bodies(), cut=st.integers(0, 10_000))
def test_a_chunked_body_is_framed_the_same_in_one_read_in_two_or_byte_by_byte(
    body: bytes, cut: int
) -> None:
    loop = asyncio.new_event_loop()
    try:
        answer = HEAD + body
        at = len(HEAD) + cut % (len(body) + 1)
        bytewise = _framed([answer[i : i + 1] for i in range(len(answer))], loop)
        assert _framed([answer], loop) == bytewise
        assert _framed([HEAD, body], loop) == bytewise
        assert _framed([answer[:at], answer[at:]], loop) == bytewise
    finally:
        loop.close()


def test_whole_chunks_in_one_read_are_taken_and_end_the_body() -> None:
    loop = asyncio.new_event_loop()
    try:
        frames = [b'data: {"n":%d}\n\n' % i for i in range(50)]
        body = b"".join(b"%x\r\n%b\r\n" % (len(f), f) for f in frames) + b"0\r\n\r\n"
        assert _framed([HEAD + body], loop) == (False, True, b"".join(frames))
        assert _framed([HEAD, body[:-5]], loop) == (False, False, b"".join(frames))
    finally:
        loop.close()
