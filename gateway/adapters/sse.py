"""Incremental Server-Sent Events parsing (the subset LLM APIs use: ``event:`` and ``data:``)."""

from __future__ import annotations


class SSEParser:
    """Feed raw bytes as they arrive; get back complete ``(event, data)`` pairs.

    ``event`` is None when the frame had no ``event:`` line. Comment lines are skipped.
    """

    __slots__ = ("_buf", "_data", "_event")

    def __init__(self) -> None:
        self._buf = b""
        self._event: str | None = None
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        """Parse ``chunk``; return every frame it completed."""
        buf = self._buf + chunk if self._buf else chunk
        out: list[tuple[str | None, bytes]] = []
        start = 0
        if not self._data and self._event is None:
            # What LLM APIs send: whole frames of one ``data:`` line each. Taken all at once
            # when every frame of ``buf`` is one (a few calls for the read, not a few per
            # frame), else a frame at a time up to the first that is not; anything else (and
            # a frame's unfinished rest) goes line by line below.
            plain = _plain_frames(buf)
            if plain is not None:
                out, buf = plain
            else:
                while True:
                    end = buf.find(b"\n\n", start)
                    if (
                        end < 0
                        or not buf.startswith(b"data:", start, end)
                        or buf.find(b"\n", start, end) >= 0
                        or buf.find(b"\r", start, end) >= 0
                    ):
                        break
                    at = start + 5
                    if at < end and buf[at] == 0x20:  # the one space after the colon
                        at += 1
                    out.append((None, buf[at:end]))
                    start = end + 2
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            line = buf[start:end]
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    out.append((self._event, b"\n".join(self._data)))
                self._event = None
                self._data = []
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
        return out


def _plain_frames(buf: bytes) -> tuple[list[tuple[str | None, bytes]], bytes] | None:
    """Every frame ``buf`` completes, when each is a single ``data:`` line, and the rest after
    them; None when one is not. (``find`` and ``count``, never ``in``: ``bytes in bytes``
    first tries the needle as an integer, raising and clearing a TypeError each time.)"""
    frames = buf.split(b"\n\n")
    rest = frames.pop()
    done = len(buf) - len(rest)
    # Exactly two line ends per frame: none has a second line (nor an empty one before it).
    if buf.count(b"\n", 0, done) != 2 * len(frames) or buf.find(b"\r", 0, done) >= 0:
        return None
    out: list[tuple[str | None, bytes]] = []
    for frame in frames:
        if frame[:5] != b"data:":
            return None
        out.append((None, frame[6:] if frame[5:6] == b" " else frame[5:]))
    return out, rest
