"""The ingress's routes through every HTTP engine: a path is routed on its raw form split on
``/`` first, each segment percent-decoded once, so an escaped slash (``%2F``) never acts as a
separator: ``/v1%2Fmodels`` and ``/v1%2Fchat%2Fcompletions`` are no route (a 404 in the
caller's surface shape), while an escape that is not a slash (``%63ompletions``) and a ``%``
in the query string route as before."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.e2e.conftest import CHAT, assert_openai_error, chat, config, model
from tests.fixtures.gateway import start_gateway

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.fixtures.gateway import RunningGateway

pytestmark = pytest.mark.e2e

ANTHROPIC = {"anthropic-version": "2023-06-01"}
CLAUDE = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def gw(tmp_path: Path, engine: str) -> AsyncIterator[RunningGateway]:
    """A gateway on ``engine`` with an echo model ``m``."""
    running = await start_gateway(
        config(model("m", {"kind": "echo"}), server={"engine": engine}), data_dir=tmp_path
    )
    yield running
    await running.stop()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1%2Fmodels"),
        ("GET", "/v1%2fmodels"),
        ("POST", "/v1%2Fchat%2Fcompletions"),
        ("POST", "/v1/chat%2Fcompletions"),
        ("POST", "/v1%2Fresponses"),
        ("POST", "/v1%2Fembeddings"),
    ],
)
async def test_an_escaped_slash_is_no_separator_on_any_route(
    gw: RunningGateway, method: str, path: str
) -> None:
    # The route table matched the server's decoded path: these listed models or chatted.
    resp = await gw.http().request(method, path, json=chat("m"))
    err = assert_openai_error(resp, 404, "not_found")
    assert "%2F" in err["message"], err


async def test_an_escaped_slash_on_the_messages_route_is_an_anthropic_404(
    gw: RunningGateway,
) -> None:
    resp = await gw.http().post("/v1%2Fmessages", json=CLAUDE, headers=ANTHROPIC)

    assert resp.status_code == 404, resp.text
    body = resp.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error", body
    assert "/v1%2Fmessages" in body["error"]["message"], body


@pytest.mark.parametrize(
    "path", [CHAT, "/v1/chat/%63ompletions", "/v1/chat/completions?note=a%2Fb"]
)
async def test_a_chat_path_without_an_escaped_slash_is_served(
    gw: RunningGateway, path: str
) -> None:
    resp = await gw.http().post(path, json=chat("m"))

    assert resp.status_code == 200, resp.text
    assert resp.json()["object"] == "chat.completion"


async def test_the_models_list_is_served_on_its_plain_path(gw: RunningGateway) -> None:
    resp = await gw.http().get("/v1/models")

    assert resp.status_code == 200, resp.text
    assert "m" in [row["id"] for row in resp.json()["data"]]


async def test_a_route_path_that_does_not_decode_is_400(gw: RunningGateway) -> None:
    err = assert_openai_error(await gw.http().post("/v1/chat%FF", json=chat("m")), 400)
    assert "UTF-8" in err["message"], err
