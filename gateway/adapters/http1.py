"""One upstream HTTP/1.1 connection: an ``asyncio.Protocol`` framing the answers that arrive.

Its callbacks run in the event loop, outside any request's task: they parse the status line
and headers, take the body off Content-Length, chunked or close-delimited framing (none for
HEAD, 204 and 304), inflate gzip and deflate, apply the read timeout (the longest gap between
arrivals) and wake the task waiting on ``waiter``. What a request does with a connection
(writing it, taking the body, pooling) is ``upstream_http``'s, so that a request's own code
runs in that one module. A malformed answer ends in ``error`` (a ``MalformedAnswerError``),
never in an exception out of a callback.

Bounds: a body is never taken past its bound, as received nor as inflated (zlib's
``max_length``, so a gzip bomb stops being inflated at the bound): ``limit`` (the sender's,
for a whole answer), past which the answer ends in an ``AnswerTooLargeError``; and
:data:`ERROR_BODY_MAX` for an error answer's, past which its body is cut and the connection
closed (its status still says what went wrong: a 422 echoing a large request stays the
client's error, not the upstream's bad answer). A stream has no bound on its whole body (its
events are bounded where they are parsed), but one read of it inflates to at most
:data:`STREAM_INFLATE_MAX`.
"""

from __future__ import annotations

import asyncio
import re
import zlib
from itertools import repeat
from typing import cast

from multidict import CIMultiDict, CIMultiDictProxy

__all__ = [
    "ERROR_BODY_MAX",
    "IDLE",
    "STREAM_INFLATE_MAX",
    "WAITING_HEAD",
    "AnswerTooLargeError",
    "Http1Connection",
    "MalformedAnswerError",
]

WAITING_HEAD, _LENGTH, _SIZE, _DATA, _CRLF, _TRAILER, _UNTIL_CLOSE, IDLE = range(8)
_HEAD_MAX = 64 * 1024  # a longer answer head (or chunk framing line) is malformed
_HIGH_WATER = 256 * 1024  # a stream buffering more than this stops reading until it is read
# Interim (1xx) answers accepted before an answer's final head. Nothing we send asks for one
# (no ``Expect: 100-continue``); servers send at most a 100 and a 103 or two, and Go's client
# refuses a sixth. More is an upstream looping or hostile, not an answer.
_INTERIM_MAX = 8
ERROR_BODY_MAX = 1024 * 1024
"""Bytes of an error answer's body (status 300 and above), as received and as inflated.
Providers' error bodies are a few hundred bytes of JSON, a proxy's HTML page some kB; only
the message and a few markers in it are used (the client sees at most 2,000 characters)."""
STREAM_INFLATE_MAX = 16 * 1024 * 1024
"""Bytes one read of a compressed stream may inflate to. A read is at most 256 KiB (asyncio's
and uvloop's), and compressed events inflate 10-30 times, so this leaves room to spare; a
gzip bomb inflates a thousand times."""
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_STATUS_LINE = re.compile(r"HTTP/1\.([01]) ([0-9]{3})(?: [^\r\n]*)?")
NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())


class MalformedAnswerError(Exception):
    """An answer that cannot be framed (bad status line, header, length or chunk)."""


class AnswerTooLargeError(MalformedAnswerError):
    """An answer whose body is over its bound, as received or as inflated."""


class _Cut(Exception):  # noqa: N818 - not an error: an error answer's body ends at its bound
    """An error answer's body reached :data:`ERROR_BODY_MAX`: what fits is kept."""


_LAST_CHUNK = b"\r\n0\r\n\r\n"  # a chunk's end, then the last chunk and no trailer


def _whole_chunks(data: bytes) -> tuple[bytes, bool] | None:
    """The data of ``data`` (read at a chunk's start) and whether it ended the body, when it
    is the usual read: whole chunks none of which holds a CRLF, each size bare hex, maybe
    the last chunk with no trailer after them; else None. Taken in a few calls, not a few
    per chunk: split on CRLF, sizes and data alternate, and each size matches its data's
    length exactly, so the loop in ``_chunked`` would have read the same chunks."""
    last = data.endswith(_LAST_CHUNK)
    body = data[:-5] if last else data  # the CRLF that ends the last data chunk kept
    if not body.endswith(b"\r\n"):
        return None
    parts = body.split(b"\r\n")
    parts.pop()  # after the last CRLF
    sizes, pieces = parts[::2], parts[1::2]
    if len(sizes) != len(pieces) or not b"".join(sizes).isalnum():
        return None
    try:
        if max(map(len, sizes)) > 16:
            return None
        lengths = list(map(int, sizes, repeat(16)))
    except ValueError:  # not hex
        return None
    if 0 in lengths or lengths != list(map(len, pieces)):
        return None
    return b"".join(pieces), last


def _size(line: bytes) -> int:
    """A chunk size line's size, its extensions and padding dropped. Raises
    MalformedAnswerError."""
    size = line.partition(b";")[0].strip(b" \t")
    if _HEX.fullmatch(size) is None:
        raise MalformedAnswerError(f"bad chunk size {size[:20]!r}")
    return int(size, 16)


class Http1Connection(asyncio.Protocol):
    """Owns one transport and the state of the answer arriving on it. ``closed``: it must
    not be reused (closed by either side, or out of step); ``complete``: the answer is all
    in; ``error``: why it ended early (TimeoutError, ConnectionResetError,
    MalformedAnswerError, zlib.error); ``pieces``: body bytes not yet taken."""

    __slots__ = (
        "_bound", "_buffered", "_conns", "_cut", "_inflate", "_inflated", "_interim", "_left",
        "_paused", "_received", "buf", "closed", "complete", "encoding", "error", "headers",
        "keep_alive", "last", "limit", "loop", "no_body", "origin", "pieces", "state",
        "status", "timeout", "timer", "timer_at", "transport", "waiter", "whole",
    )  # fmt: skip

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        origin: tuple[str, str, int],
        conns: set[Http1Connection],
    ) -> None:
        self.loop = loop  # its own: a connection lives and dies on the loop it was opened on
        self._conns = conns  # the client's open connections: in it while open
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.state = IDLE
        self.buf = b""  # a head or framing line not yet whole
        self._left = 0  # bytes left of the Content-Length body, or of the chunk
        self._interim = 0  # interim answers received before this answer's final head
        self.limit = 0  # the sender's bound on a whole answer's body (0: a stream's, none)
        self._bound = 0  # this answer's bound on its body (0: none)
        self._cut = False  # past the bound, cut the body (an error answer) rather than fail
        self._received = 0  # body bytes received of this answer (counted when bound)
        self._inflated = 0  # bytes its body inflated to (counted when bound)
        self.encoding: str | None = None
        self._inflate: zlib._Decompress | None = None
        self._paused = False
        self._buffered = 0  # bytes in ``pieces`` (of a stream: a whole answer never stops)
        self.whole = True  # wake the waiter at the answer's end, not at its head
        self.timeout = 0.0
        self.last = 0.0  # when data last arrived (or the request went out)
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        self.closed = self.complete = self.keep_alive = self.no_body = False
        self.error: BaseException | None = None
        self.status = 0
        self.headers = NO_HEADERS
        self.pieces: list[bytes] = []
        self.waiter: asyncio.Future[None] | None = None

    def taken(self) -> None:
        """The buffered pieces were taken: read again if it had stopped."""
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        """Close the connection (idempotent): never reused, its upstream sees it go."""
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.close()

    def on_timer(self) -> None:
        """The read timeout's check, armed by the sender: fail after a silent gap."""
        self.timer = None
        if self.state == IDLE or self.closed:
            return  # the answer is in: the timer lapses until the next request arms it
        now = self.loop.time()
        due = now + self.timeout if self._paused else self.last + self.timeout
        if now < due:  # data came within the gap: wait for the rest of the next one
            self.timer_at = due
            self.timer = self.loop.call_at(due, self.on_timer)
        else:
            self._fail(TimeoutError(f"nothing arrived for {self.timeout} s"))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's is not a subclass
        self._conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._conns.discard(self)
        self.eof_received()
        self.close()

    def eof_received(self) -> None:
        self.closed = True
        if self.state == _UNTIL_CLOSE:
            self._finish(b"")
        else:
            self._fail(ConnectionResetError("the upstream closed the connection"))

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state == IDLE:  # bytes nobody asked for: the connection is out of step
            self.close()
            return
        self.last = self.loop.time()
        if self.buf:
            data, self.buf = self.buf + data, b""
        try:
            if state == WAITING_HEAD:
                rest = self._head(data)
                if rest is None:
                    return
                data, state = rest, self.state
            if state == _LENGTH:
                self._length(data)
            elif state == _UNTIL_CLOSE:
                self._piece(data)
            elif state != IDLE:
                self._chunked(data)
        except _Cut:
            self._end_cut()
        except (MalformedAnswerError, zlib.error) as exc:
            self._fail(exc)
        except ValueError:  # int() of a chunk size that is not hex
            self._fail(MalformedAnswerError("bad chunk size"))

    def _head(self, data: bytes) -> bytes | None:
        """Parse the answer's head; the bytes after it, or None (the answer ended, or its
        head is not all in). Interim answers before it are skipped, in a loop: an upstream
        sending thousands in one read once recursed past Python's stack limit."""
        while True:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                if len(data) > _HEAD_MAX:
                    raise MalformedAnswerError("answer head too long")
                self.buf = data
                return None
            lines = data[:end].decode("utf-8", "surrogateescape").split("\r\n")
            data = data[end + 4 :]
            match = _STATUS_LINE.fullmatch(lines[0])
            if match is None:
                raise MalformedAnswerError(f"bad status line {lines[0][:40]!r}")
            status = int(match[2])
            if status >= 200:
                break
            # An interim answer (100 Continue, 103 Early Hints): the next follows.
            if status == 101 or status < 100:
                raise MalformedAnswerError(f"unexpected status {status}")
            self._interim += 1
            if self._interim > _INTERIM_MAX:
                raise MalformedAnswerError(f"more than {_INTERIM_MAX} interim answers")
            if not data:
                return None
        self._interim = 0  # the final head: the connection's next answer counts anew
        self._received = self._inflated = 0
        limit = self.limit
        self._cut = status >= 300
        if self._cut:
            limit = min(limit, ERROR_BODY_MAX) if limit else ERROR_BODY_MAX
        self._bound = limit
        rest = data
        pairs = []
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name[-1] in " \t" or name[0] in " \t":
                raise MalformedAnswerError(f"bad header line {line[:40]!r}")
            pairs.append((name, value.strip(" \t")))
        headers = self.headers = CIMultiDictProxy(CIMultiDict(pairs))
        self.status = status
        connection = headers.get("connection", "").lower()
        self.keep_alive = "close" not in connection and (
            match[1] == "1" or "keep-alive" in connection
        )
        encoding = headers.get("content-encoding", "").lower().strip()
        if encoding in ("gzip", "x-gzip", "deflate"):
            self.encoding = encoding
        if not self.whole:
            self._wake()
        return self._framing(headers, status, rest)

    def _framing(self, headers: CIMultiDictProxy[str], status: int, rest: bytes) -> bytes | None:
        transfer = headers.get("transfer-encoding")
        length = headers.get("content-length")
        if self.no_body or status in (204, 304):
            self._finish(rest)
            return None
        if transfer is not None:
            chunked = transfer.lower().rstrip(" \t").endswith("chunked")
            self.state = _SIZE if chunked else _UNTIL_CLOSE
            self.keep_alive = self.keep_alive and chunked
        elif length is not None:
            if not (length.isascii() and length.isdigit()):
                raise MalformedAnswerError(f"bad Content-Length {length[:20]!r}")
            self._left, self.state = int(length), _LENGTH
            if self._bound and self._left > self._bound and not self._cut:  # before reading
                raise AnswerTooLargeError(f"the body is over {self._bound} bytes")
            if not self._left:
                self._finish(rest)
                return None
        else:
            self.state, self.keep_alive = _UNTIL_CLOSE, False
        return rest

    def _length(self, data: bytes) -> None:
        left = self._left
        if len(data) < left:
            self._left = left - len(data)
            self._piece(data)
        else:
            self._piece(data[:left] if len(data) > left else data)
            self._finish(data[left:])

    def _chunked(self, data: bytes) -> None:
        """Take the chunks' data out of ``data`` as one piece; keep a framing line not yet
        whole for the next arrival."""
        if self.state == _SIZE and (whole := _whole_chunks(data)) is not None:
            taken, ended = whole
            self._piece(taken)
            if ended:
                self._finish(b"")
            return
        out: list[bytes] = []
        pos, end, state = 0, len(data), self.state
        while pos < end:
            if state == _SIZE:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    break
                line, pos = data[pos:eol], eol + 2
                # The usual line is bare hex digits; else extensions or padding to strip.
                size = int(line, 16) if line.isalnum() and len(line) <= 16 else _size(line)
                stop = pos + size
                if not size:
                    state = _TRAILER
                elif data[stop : stop + 2] == b"\r\n":  # the whole chunk and its CRLF: one step
                    out.append(data[pos:stop])
                    pos = stop + 2
                elif stop + 2 <= end:
                    raise MalformedAnswerError("chunk not followed by CRLF")
                else:
                    self._left, state = size, _DATA
            elif state == _DATA:
                left = self._left
                if end - pos < left:
                    self._left = left - (end - pos)
                    out.append(data[pos:])
                    pos = end
                    break
                out.append(data[pos : pos + left])
                pos, state = pos + left, _CRLF
            elif state == _CRLF:
                if end - pos < 2:
                    break
                if data[pos : pos + 2] != b"\r\n":
                    raise MalformedAnswerError("chunk not followed by CRLF")
                pos, state = pos + 2, _SIZE
            else:  # the trailer fields (ignored), up to an empty line
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    break
                if eol == pos:
                    self._piece(out[0] if len(out) == 1 else b"".join(out))
                    self._finish(data[pos + 2 :])
                    return
                pos = eol + 2
        self.state = state
        if out:
            self._piece(out[0] if len(out) == 1 else b"".join(out))
        if end - pos > _HEAD_MAX:
            raise MalformedAnswerError("chunk framing line too long")
        self.buf = data[pos:]

    def _piece(self, data: bytes) -> None:
        cut = False
        if self._bound:
            self._received += len(data)
            if self._received > self._bound:
                if not self._cut:
                    raise AnswerTooLargeError(f"the body is over {self._bound} bytes")
                data, cut = data[: len(data) - (self._received - self._bound)], True
        if self.encoding is not None:
            data = self._inflate_piece(data)
        if cut:
            self.pieces.append(data)
            raise _Cut
        if not data:
            return
        pieces = self.pieces
        pieces.append(data)
        if not self.whole:
            self._wake()
            self._buffered += len(data)
            if self._buffered > _HIGH_WATER and self.transport and not self._paused:
                self._paused = True
                self.transport.pause_reading()

    def _inflate_piece(self, data: bytes) -> bytes:
        """``data`` inflated, never past the bound (one byte over says it is over). Raises
        AnswerTooLargeError, zlib.error."""
        inflate = self._inflate
        if inflate is None:
            if not data:  # the first byte decides the kind of deflate: wait for it
                return b""
            if self.encoding == "deflate":  # zlib-wrapped as the RFC says, or raw as some send
                wbits = zlib.MAX_WBITS if data and data[0] & 0x0F == 8 else -zlib.MAX_WBITS
            else:
                wbits = 16 + zlib.MAX_WBITS
            inflate = self._inflate = zlib.decompressobj(wbits)
        bound = self._bound
        room = bound - self._inflated if bound else STREAM_INFLATE_MAX
        # Short of ``room + 1`` bytes out, zlib took all of ``data`` (no unconsumed_tail).
        out = inflate.decompress(data, room + 1)
        if len(out) > room:
            if self._cut:
                self.pieces.append(out[:room])
                raise _Cut
            if bound:
                raise AnswerTooLargeError(f"the body inflates to over {bound} bytes")
            raise AnswerTooLargeError(f"one read inflates to over {STREAM_INFLATE_MAX} bytes")
        self._inflated += len(out)
        return out

    def _finish(self, rest: bytes) -> None:
        if self._inflate is not None:
            tail = self._inflate.flush()  # all input was taken: at most what zlib held back
            self._inflate = None
            if tail:
                room = self._bound - self._inflated if self._bound else len(tail)
                if len(tail) > room and not self._cut:
                    self._fail(AnswerTooLargeError(f"the body is over {self._bound} bytes"))
                    return
                self.pieces.append(tail[:room])
        self.state, self.complete = IDLE, True
        self._buffered = 0
        if self._paused:  # nothing more is due: a pooled connection must be reading
            self._paused = False
            assert self.transport is not None
            self.transport.resume_reading()
        if rest:  # bytes past the answer: nothing was pipelined, so the stream is out of step
            self.keep_alive = False
        self._wake()

    def _end_cut(self) -> None:
        """An error answer cut at its bound: complete with what was kept; the rest of it is
        still on the connection, which closes."""
        self._inflate = None
        self.keep_alive = False
        self.state, self.complete = IDLE, True
        self.close()
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if self.state == IDLE:
            return
        self.state, self.error = IDLE, exc
        self.close()
        self._wake()

    def _wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
