"""A refusal that no retry soon can change tells the SDKs not to retry it.

The official SDKs retry a 429 twice by default, waiting out a ``Retry-After`` of at most 60 s
and otherwise a second or two of their own: a spent budget (its next period hours away) or
an upstream's spent quota was asked three times, each refused, the caller waiting for
nothing. Such an answer carries ``x-should-retry: false``, which both SDKs obey (a rate
limit whose wait they honour does not: tests/unit/gateway/http/test_errors.py). Through the
official openai and anthropic SDKs with their default retries, on the in-process bus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anthropic
import openai
import pytest

from tests.e2e.conftest import HI, ONE_BUS, config, model, route
from tests.e2e.keys_support import keys_config
from tests.e2e.limits_support import new_key, set_limit
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from pathlib import Path

    import httpx

    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

QUOTA = {
    "error": {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota",
        "param": None,
        "code": "insufficient_quota",
    }
}


class Sent:
    """An httpx event hook keeping the status of every answer the client got."""

    def __init__(self) -> None:
        self.statuses: list[int] = []

    async def __call__(self, response: httpx.Response) -> None:
        self.statuses.append(response.status_code)

    def client(self, sdk: Any) -> Any:
        return sdk.DefaultAsyncHttpxClient(event_hooks={"response": [self]})


async def test_a_spent_budget_is_asked_once_by_each_sdk(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    priced = route(fake_upstream, pricing={"prompt": 2.0, "completion": 10.0})
    gw = await gateway_factory(keys_config(tmp_path, model("m", priced)))
    key, _ = await new_key(gw, org="acme")
    # One request costs (10 * 2 + 5 * 10) / 1e6 = 70 micro-USD of the 100 the org may spend.
    await set_limit(gw, "org", "acme", budget="0.0001/day")
    await gw.openai(key).chat.completions.create(model="m", messages=HI, max_tokens=5)
    chat, messages = Sent(), Sent()

    retrying = gw.openai(key, http_client=chat.client(openai)).with_options(max_retries=2)
    with pytest.raises(openai.RateLimitError) as refused:
        await retrying.chat.completions.create(model="m", messages=HI, max_tokens=5)
    claude = gw.anthropic(key, http_client=messages.client(anthropic)).with_options(max_retries=2)
    with pytest.raises(anthropic.RateLimitError):
        await claude.messages.create(model="m", max_tokens=5, messages=HI)

    assert refused.value.code == "budget_exceeded"
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert (chat.statuses, messages.statuses) == ([429], [429])
    assert len(fake_upstream.requests) == 1


async def test_an_upstreams_spent_quota_is_asked_once(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.set_default(Reply(429, body=QUOTA))
    gw = await gateway_factory(config(model("m", route(fake_upstream))))
    sent = Sent()

    retrying = gw.openai(http_client=sent.client(openai)).with_options(max_retries=2)
    with pytest.raises(openai.RateLimitError):
        await retrying.chat.completions.create(model="m", messages=HI)

    assert sent.statuses == [429]
