"""A key pool's failures through the real server with the openai SDK: an upstream that
refuses one key (401/403) or says its quota is spent is one key's problem, not the route's,
so the same request is served at once on the route's next key and the refused key is muted;
a spent quota's mute doubles while the key is found still spent and starts short again once
it served. Fake upstreams on loopback answer per credential."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from schemas import KeyMuted, KeyUnmuted, subjects
from schemas.config import credential_id
from tests.e2e.conftest import HI, eid, model, route, watch
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


async def test_a_spent_quota_mute_doubles_while_spent_and_starts_short_after_a_success(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    up = await fake_upstreams("up")
    base = 0.4
    gw = await gateway_factory(
        keys_config(
            tmp_path,
            model("m", route(up, api_keys=[A, B])),
            key_pool={"mute_seconds": base, "quota_mute_max_seconds": 4 * base},
        )
    )
    client = gw.openai()
    pool = eid("m", up)
    up.key_behaviours[A] = OUT_OF_QUOTA  # its probes find it spent too
    async with watch(gw, subjects.event("keypool")) as events:
        await client.chat.completions.create(model="m", messages=HI)
        first = await events.next(KeyMuted)
        assert (first.pool, first.status) == (pool, 429)
        assert first.seconds == pytest.approx(base, abs=0.01)
        # Each probe that finds the quota still spent doubles the mute, up to the cap.
        for seconds in (2 * base, 4 * base, 4 * base):
            again = await events.next(KeyMuted)
            assert again.reason == "probe failed"
            assert again.seconds == pytest.approx(seconds, abs=0.01)
        del up.key_behaviours[A]  # the quota is back
        await events.next(KeyUnmuted, lambda e: e.credential_id == credential_id(A))
        await client.chat.completions.create(model="m", messages=HI)
        assert keys_sent(up)[-1] == A  # the caller's binding to A held through the mute
        up.key_behaviours[A] = OUT_OF_QUOTA
        await client.chat.completions.create(model="m", messages=HI)
        muted = await events.next(KeyMuted, lambda e: e.status == 429)
    assert muted.seconds == pytest.approx(base, abs=0.01)  # the success reset the doubling
