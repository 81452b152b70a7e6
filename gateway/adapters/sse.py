"""Incremental Server-Sent Events parsing (the subset LLM APIs use: ``event:`` and ``data:``)."""

from __future__ import annotations

from itertools import repeat
from typing import TYPE_CHECKING

from gateway.adapters.base import bad_response

if TYPE_CHECKING:
    from schemas import UpstreamBadResponseError

MAX_EVENT_BYTES = 16 * 1024 * 1024
"""An event still open past this many bytes is a malformed answer. The largest legitimate
ones (an OpenAI Responses ``response.completed`` or ``output_item.done`` repeating a whole long
answer or a generated image in base64, a tool call's arguments sent in one delta) stay within
a few MiB; the bound leaves them room four times over, and keeps an upstream that never ends
its line from holding the worker's memory without limit."""

_HOLD_PAST = 16 * 1024
"""An unfinished line longer than this is held while reads that end no line arrive; a shorter
one is read again with the next read (at most this much again per read), cheaper than asking
first whether the read ends a line."""


class SSEParser:
    """Feed raw bytes as they arrive; get back complete ``(event, data)`` pairs.

    ``event`` is None when the frame had no ``event:`` line. Comment lines are skipped. Lines
    end with LF, CRLF or CR alone, as the SSE specification allows. A long line costs in
    proportion to its length: the reads that end no line are held, not scanned again.
    """

    __slots__ = ("_buf", "_cr", "_data", "_endpoint", "_event", "_held", "_size")

    def __init__(self, endpoint: str = "") -> None:
        self._endpoint = endpoint  # named by the error of an oversized event
        self._buf = b""  # the unfinished line the last scanned read ended with
        self._held = bytearray()  # the reads since, none ending a line: not scanned again
        self._size = 0  # the bytes the open event took so far, held or already parsed
        self._cr = False  # the last read ended in CR: a LF opening the next is the same end
        self._event: str | None = None
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        """Parse ``chunk``; return every frame it completed. Raises UpstreamBadResponseError
        when the open event grows past :data:`MAX_EVENT_BYTES`."""
        if self._cr:
            if not chunk:
                return []
            self._cr = False
            if chunk[0] == 0x0A:  # the CRLF was cut between two reads: its CR ended the line
                chunk = chunk[1:]
        if chunk.find(b"\r") >= 0:
            # A LF-framed stream pays only the test; here every line end becomes a LF, a CR
            # closing the read too (it ends its line whether or not a LF follows).
            self._cr = chunk[-1] == 0x0D
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf
        if not buf:
            buf = chunk
        elif len(buf) <= _HOLD_PAST:
            buf += chunk
        elif chunk.find(b"\n") < 0:
            # Nothing ends here: the read waits for the one ending its line, and what came
            # before is neither copied nor scanned again (once per read, that was O(n²)).
            self._held += chunk  # not a list of them: a read may be a byte or two
            self._size += len(chunk)
            if self._size > MAX_EVENT_BYTES:
                raise self._too_large()
            return []
        else:
            buf = b"".join((buf, self._held, chunk))
            self._held = bytearray()
        out: list[tuple[str | None, bytes]] = []
        start = 0
        opened = -1  # where the event still open began, when one ended in ``buf``
        if not self._data and self._event is None:
            # What LLM APIs send: whole frames of one ``data:`` line each. Taken all at once
            # when every frame of ``buf`` is one (a few calls for the read, not a few per
            # frame), else a frame at a time up to the first that is not; anything else (and
            # a frame's unfinished rest) goes line by line below.
            plain = _plain_frames(buf)
            if plain is not None:
                out, buf = plain
                opened = 0
            else:
                while True:
                    end = buf.find(b"\n\n", start)
                    if (
                        end < 0
                        or not buf.startswith(b"data:", start, end)
                        or buf.find(b"\n", start, end) >= 0
                    ):
                        break
                    at = start + 5
                    if at < end and buf[at] == 0x20:  # the one space after the colon
                        at += 1
                    out.append((None, buf[at:end]))
                    start = opened = end + 2
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            line = buf[start:end]
            start = end + 1
            if not line:
                if self._data:
                    out.append((self._event, b"\n".join(self._data)))
                self._event = None
                self._data = []
                opened = start
                continue
            if line[:1] == b":":
                continue
            field, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if field == b"data":
                self._data.append(value)
            elif field == b"event":
                self._event = value.decode("utf-8", "replace")
        self._buf = buf[start:]
        # Raised before the events this read ended are returned: only a read larger than the
        # bound can end some and leave one open past it, and the upstream client hands over at
        # most a few hundred KiB at a time.
        size = self._size + len(chunk) if opened < 0 else len(buf) - opened
        self._size = size
        if size > MAX_EVENT_BYTES:
            raise self._too_large()
        return out

    def _too_large(self) -> UpstreamBadResponseError:
        return bad_response(self._endpoint, f"a stream event is over {MAX_EVENT_BYTES} bytes")


def _plain_frames(buf: bytes) -> tuple[list[tuple[str | None, bytes]], bytes] | None:
    """Every frame ``buf`` completes, when each is a single ``data:`` line, and the rest after
    them; None when one is not. (``find`` and ``count``, never ``in``: ``bytes in bytes``
    first tries the needle as an integer, raising and clearing a TypeError each time.)"""
    end = buf.rfind(b"\n\n")
    if end < 0:
        return [], buf
    if buf.startswith(b"data: "):
        # The usual read: frames of one ``data: `` line each. One frame (its first LF ends
        # it), or many: their data split on a frame's end and the next one's prefix in one
        # pass, each frame one line if no data holds a LF.
        if buf.find(b"\n") == end:
            return [(None, buf[6:end])], buf[end + 2 :]
        data = buf[6:end].split(b"\n\ndata: ")
        if b"".join(data).find(b"\n") < 0:
            return list(zip(repeat(None), data)), buf[end + 2 :]
    frames = buf.split(b"\n\n")
    rest = frames.pop()
    done = len(buf) - len(rest)
    # Exactly two line ends per frame: none has a second line (nor an empty one before it).
    if buf.count(b"\n", 0, done) != 2 * len(frames):
        return None
    out: list[tuple[str | None, bytes]] = []
    for frame in frames:
        if frame[:5] != b"data:":
            return None
        out.append((None, frame[6:] if frame[5:6] == b" " else frame[5:]))
    return out, rest
