"""A key pool's failures through the real server with the openai SDK: an upstream that
refuses one key (401/403) or says its quota is spent is one key's problem, not the route's,
so the same request is served at once on the route's next key and the refused key is muted.
Fake upstreams on loopback answer per credential."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from schemas import KeyMuted, subjects
from schemas.config import credential_id
from tests.e2e.conftest import HI, model, route, watch
from tests.e2e.keys_support import keys_config
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream, UpstreamFactory

pytestmark = pytest.mark.e2e

A, B = "sk-upstream-aaaa", "sk-upstream-bbbb"
OUT_OF_QUOTA = Reply(
    429,
    body={"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}},
)


def keys_sent(up: FakeUpstream) -> list[str | None]:
    """The credential of every request a client sent (a background probe asks one token)."""
    return [r.credential for r in up.requests if r.json and r.json.get("max_tokens") != 1]


@pytest.mark.parametrize(
    ("refusal", "stream"),
    [(Reply(401), False), (Reply(403), True), (OUT_OF_QUOTA, False), (OUT_OF_QUOTA, True)],
    ids=["401-whole", "403-stream", "quota-whole", "quota-stream"],
)
async def test_a_refused_key_is_retried_at_once_on_the_routes_next_key_then_muted(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
    refusal: Reply,
    stream: bool,
) -> None:
    up = await fake_upstreams("up")
    up.key_behaviours[A] = refusal
    gw = await gateway_factory(keys_config(tmp_path, model("m", route(up, api_keys=[A, B]))))
    client = gw.openai()
    async with watch(gw, subjects.event("keypool")) as events:
        if stream:
            chunks = await client.chat.completions.create(model="m", messages=HI, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
        else:
            text = (
                (await client.chat.completions.create(model="m", messages=HI))
                .choices[0]
                .message.content
            )
        assert text == up.text  # served, on the same route, by its other key
        assert keys_sent(up) == [A, B]
        muted = await events.next(KeyMuted)
    assert (muted.credential_id, muted.status) == (credential_id(A), refusal.status)
    await client.chat.completions.create(model="m", messages=HI)
    assert keys_sent(up) == [A, B, B]  # the refused key is out of rotation
