"""``GET /v1/models`` in Anthropic's shape pages as Anthropic's does.

The anthropic SDK's ``models.list(limit=, after_id=, before_id=)`` asks for one page and
follows ``has_more`` / ``last_id`` (``first_id`` going back) for the next. The gateway
answered every such request with the whole list and ``has_more: false``, whatever it asked:
``limit=2`` gave every model, and a cursor was not read. Now a page holds ``limit`` models
(20 when not given) after ``after_id`` or before ``before_id``, and a limit out of range or
a cursor naming no listed model is a 400 naming it. Through the official SDKs, on the
in-process bus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anthropic
import pytest

from tests.e2e.conftest import ONE_BUS, config, model, route

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]


@pytest.fixture
async def gw(gateway_factory: GatewayFactory, fake_upstream: FakeUpstream) -> RunningGateway:
    """Models ``a``, ``b``, ``c`` (and the steering ids listed after them)."""
    return await gateway_factory(config(*(model(m, route(fake_upstream)) for m in "abc")))


async def test_a_page_holds_limit_models_and_the_sdk_follows_the_cursors(
    gw: RunningGateway,
) -> None:
    listed = [m.id for m in (await gw.openai().models.list()).data]
    client = gw.anthropic()

    first = await client.models.list(limit=2)
    every = [m.id async for m in client.models.list(limit=2)]
    back = await client.models.list(limit=2, before_id=listed[3])

    assert [m.id for m in first.data] == listed[:2]
    assert (first.has_more, first.first_id, first.last_id) == (True, listed[0], listed[1])
    assert every == listed
    assert [m.id for m in back.data] == listed[1:3] and back.has_more is True


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"after_id": "nope"}, "after_id"),
        # int() took them: an underscore, another script's digit.
        ({"limit": "1_0"}, "limit"),
        ({"limit": "\uff15"}, "limit"),
    ],
)
async def test_a_page_it_cannot_answer_is_a_400_naming_the_field(
    gw: RunningGateway, query: dict[str, int | str], param: str
) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        await gw.anthropic().models.list(extra_query=query)

    assert refused.value.message.split(" ", 1)[1].startswith(f"{param}:")
