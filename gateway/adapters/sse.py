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
            # What LLM APIs send: whole frames of one ``data:`` line each, taken a frame at a
            # time; anything else (and a frame's unfinished rest) goes line by line below.
            # (``find``, not ``in``: ``bytes in bytes`` first tries the needle as an integer
            # and raises and clears a TypeError each time, thousands of instructions.)
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
