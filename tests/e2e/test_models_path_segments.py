"""``GET /v1/models/{id}`` through every HTTP engine: the id is the rest of the raw path, its
segments each percent-decoded once and joined by ``/``, so an id with a slash
(``openai/gpt-4o``) answers sent as it is or with its slash escaped (``%2F``, as OpenAI's SDK
sends it), an id with a ``%`` answers only escaped (``%25``), and a path that does not decode
is a 400."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.e2e.conftest import assert_openai_error, config, model
from tests.fixtures.gateway import start_gateway

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.fixtures.gateway import RunningGateway

pytestmark = pytest.mark.e2e


@pytest.fixture
async def gw(tmp_path: Path, engine: str) -> AsyncIterator[RunningGateway]:
    """A gateway on ``engine`` with echo models ``openai/gpt-4o`` and ``50%2Foff``."""
    echo = {"kind": "echo"}
    running = await start_gateway(
        config(model("openai/gpt-4o", echo), model("50%2Foff", echo), server={"engine": engine}),
        data_dir=tmp_path,
    )
    yield running
    await running.stop()


@pytest.mark.parametrize(
    "path",
    [
        "/v1/models/openai/gpt-4o",
        "/v1/models/openai%2Fgpt-4o",
        "/v1/models/openai%2fgpt-4o",
        "/v1/models/%6Fpenai/gpt-4o",
    ],
)
async def test_a_model_id_with_a_slash_answers_plain_or_escaped(
    gw: RunningGateway, path: str
) -> None:
    resp = await gw.http().get(path)
    assert resp.status_code == 200, resp.text
    assert resp.json()["id"] == "openai/gpt-4o"


async def test_a_percent_in_a_model_id_is_decoded_once(gw: RunningGateway) -> None:
    client = gw.http()
    escaped = await client.get("/v1/models/50%252Foff")
    assert escaped.status_code == 200, escaped.text
    assert escaped.json()["id"] == "50%2Foff"
    # Decoded once it is ``50/off``, no model: never decoded again into the other id.
    err = assert_openai_error(await client.get("/v1/models/50%2Foff"), 404, "route_not_found")
    assert "50/off" in err["message"], err


@pytest.mark.parametrize("path", ["/v1%2Fmodels/openai/gpt-4o", "/v1/models%2Fopenai/gpt-4o"])
async def test_an_escaped_slash_before_the_model_id_is_no_separator(
    gw: RunningGateway, path: str
) -> None:
    err = assert_openai_error(await gw.http().get(path), 404)
    assert "%2F" in err["message"], err


@pytest.mark.parametrize(
    ("path", "says"),
    [("/v1/models/gpt%FF", "UTF-8"), ("/v1/models/a%00b", "NUL")],
)
async def test_a_model_path_that_does_not_decode_is_400(
    gw: RunningGateway, path: str, says: str
) -> None:
    err = assert_openai_error(await gw.http().get(path), 400, "invalid_request")
    assert says in err["message"], err
