"""HttpRequest.body: the whole body, read from as many ASGI messages as the server sends, and
no further than the declared length (granian ends a body with an empty message that costs a
round trip between its threads and the loop)."""

from __future__ import annotations

from typing import Any

from gateway.http.request import HttpRequest


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


async def test_a_body_whose_declared_bytes_are_all_here_is_not_read_further() -> None:
    req = _request(
        [{"type": "http.request", "body": b'{"a": 1}', "more_body": True}],
        [(b"content-length", b"8")],
    )
    assert await req.body(1000) == b'{"a": 1}'


async def test_a_body_in_parts_is_read_to_its_declared_length() -> None:
    req = _request(
        [
            {"type": "http.request", "body": b'{"a"', "more_body": True},
            {"type": "http.request", "body": b": 1}", "more_body": True},
        ],
        [(b"content-length", b"8")],
    )
    assert await req.body(1000) == b'{"a": 1}'


async def test_a_chunked_body_is_read_until_the_server_says_it_ended() -> None:
    req = _request(
        [
            {"type": "http.request", "body": b'{"a": 1}', "more_body": True},
            {"type": "http.request", "body": b"", "more_body": False},
        ],
        [(b"transfer-encoding", b"chunked")],
    )
    assert await req.body(1000) == b'{"a": 1}'
