"""HttpRequest.segments (and those after a prefix): the raw path split on ``/`` before each
segment is decoded once, the decoded ``path`` where a server gives no ``raw_path``."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.http.request import HttpRequest
from schemas import InvalidRequestError, RouteNotFoundError


def _request(path: str, raw_path: bytes | None) -> HttpRequest:
    scope: dict[str, Any] = {"type": "http", "method": "GET", "path": path, "headers": []}
    if raw_path is not None:
        scope["raw_path"] = raw_path

    async def receive() -> dict[str, Any]:
        raise AssertionError("no body is read")

    async def send(msg: Any) -> None:
        return None

    return HttpRequest(scope, receive, send)


def test_an_escaped_slash_stays_inside_its_segment_and_is_decoded_once() -> None:
    req = _request("/admin/chains/list", b"/admin/chains%2Flist/a%2541")
    assert req.segments() == ["admin", "chains/list", "a%41"]
    assert req.split_path() == "/admin/chains%2Flist/a%41"


def test_without_a_raw_path_the_decoded_path_is_split() -> None:
    assert _request("/admin/chains/list", None).segments() == ["admin", "chains", "list"]


@pytest.mark.parametrize(
    ("raw", "says"), [(b"/admin/li%FFst", "UTF-8"), (b"/admin/a%00b", "NUL"), (b"/\xff", "UTF-8")]
)
def test_a_segment_that_does_not_decode_is_invalid(raw: bytes, says: str) -> None:
    with pytest.raises(InvalidRequestError, match=says):
        _request("/admin/x", raw).segments()
    with pytest.raises(InvalidRequestError, match="NUL"):
        _request("/admin/a\x00b", None).segments()


def test_segments_after_a_prefix_are_what_follows_its_segments() -> None:
    req = _request("/v1/models/openai/gpt-4o", b"/v1/models/openai%2Fgpt-4o/x")
    assert req.segments_after("/v1/models/") == ["openai/gpt-4o", "x"]


@pytest.mark.parametrize("raw", [b"/v1%2Fmodels/m", b"/v1/models%2Fm", b"/v2/models/m"])
def test_segments_after_a_prefix_the_path_does_not_begin_with_are_not_found(raw: bytes) -> None:
    with pytest.raises(RouteNotFoundError, match="no such path"):
        _request("/v1/models/m", raw).segments_after("/v1/models/")
