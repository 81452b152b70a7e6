"""HttpRequest.body: the whole body, read from as many ASGI messages as the server sends, and
no further than the declared length (granian and Hypercorn end a body with an empty message;
under granian reading it costs a round trip between its threads and the loop)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.http.request import HttpRequest
from schemas import ClientClosedError


def _request(messages: list[dict[str, Any]], headers: list[tuple[bytes, bytes]]) -> HttpRequest:
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
    given = iter(messages)

    async def receive() -> dict[str, Any]:
        try:
            return next(given)
        except StopIteration:
            raise AssertionError("read past the body's last message") from None

    async def send(msg: Any) -> None:
        return None

    return HttpRequest(scope, receive, send)


_BODY = b'{"a": 1}'
_LENGTH = [(b"content-length", b"8")]
_CHUNKED = [(b"transfer-encoding", b"chunked")]


def _part(body: bytes, more: bool) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


@pytest.mark.parametrize(
    ("messages", "headers"),
    [
        # All the declared bytes in one message: the server's closing empty one is not awaited.
        ([_part(_BODY, True)], _LENGTH),
        # In parts, up to the declared length.
        ([_part(b'{"a"', True), _part(b": 1}", True)], _LENGTH),
        # A chunked body (no length) is read until the server says it ended.
        ([_part(_BODY, True), _part(b"", False)], _CHUNKED),
    ],
    ids=["whole-at-its-length", "in-parts-to-its-length", "chunked-to-its-end"],
)
async def test_a_body_is_read_to_its_end_and_no_further(
    messages: list[dict[str, Any]], headers: list[tuple[bytes, bytes]]
) -> None:
    assert await _request(messages, headers).body(1000) == _BODY


@pytest.mark.parametrize(
    ("messages", "headers"),
    [
        ([_part(b'{"a"', True), {"type": "http.disconnect"}], _LENGTH),
        # A whole JSON object, then the client gone before the chunked body's end.
        ([_part(_BODY, True), {"type": "http.disconnect"}], _CHUNKED),
    ],
    ids=["short-of-its-length", "chunked-unended"],
)
async def test_a_body_the_client_left_unfinished_is_refused_not_served_in_part(
    messages: list[dict[str, Any]], headers: list[tuple[bytes, bytes]]
) -> None:
    with pytest.raises(ClientClosedError, match="went away"):
        await _request(messages, headers).body(1000)
