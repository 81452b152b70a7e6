"""Claude's in-stream error reaches a Messages client with its own type.

Claude ends a begun stream with ``event: error`` when it is overloaded mid-answer
(``overloaded_error``) or rate limited (``rate_limit_error``); a Claude-Code-like client
reads that type to retry an overload. The gateway relayed every such break as
``api_error``. Now the event carries the type of the status the upstream's error stands
for. Through the official ``anthropic`` SDK, against the scriptable fake upstream, on the
in-process bus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anthropic
import pytest

from tests.e2e._surface_clients import error_body
from tests.e2e.conftest import HI, ONE_BUS, anthropic_route, config, model
from tests.fixtures.upstream import Stream

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]


@pytest.mark.parametrize("kind", ["overloaded_error", "rate_limit_error"])
async def test_claudes_in_stream_error_reaches_the_client_with_its_type(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, kind: str
) -> None:
    breaking = Stream(error_after=1, error="Overloaded", error_type=kind)
    up = await fake_upstreams("up", chunks=4, default=breaking)
    gw = await gateway_factory(config(model("m", anthropic_route(up))))
    got: list[str] = []

    with pytest.raises(anthropic.APIStatusError) as broke:
        async with gw.anthropic().messages.stream(model="m", max_tokens=9, messages=HI) as s:
            async for event in s:
                if event.type == "text":
                    got.append(event.text)

    assert got, "the stream broke before it began: no in-stream error was relayed"
    error = error_body(broke.value)["error"]
    assert error["type"] == kind
    assert "Overloaded" in error["message"]
