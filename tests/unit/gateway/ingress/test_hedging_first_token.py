"""A hedged stream is decided by its first token, not by a role-only first chunk (what
OpenAI-compatible upstreams send at once, before they may stall): on the dispatcher tests'
scripted adapter, whose endpoints here open every stream with a role-only chunk. What came
before the token is held and relayed with it, from the same side; a failure or a stall while
held leaves the race to the other side; TTFT is the first token's, hedged or not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from gateway.adapters.base import Batch
from schemas import RoutePlan, subjects
from tests.unit.gateway.ingress.test_dispatcher import (
    SHORT,
    Answer,
    Fail,
    FakeClock,
    FixedTargets,
    Hang,
    Harness,
    Heard,
    ScriptedAdapter,
    cand,
    plan,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from bus import InProcessBus
    from gateway.adapters.base import JSON, UpstreamTarget


def role_chunk(endpoint: str) -> JSON:
    return {
        "id": endpoint,
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
    }


@dataclass
class RoleFirst(ScriptedAdapter):
    """The scripted adapter, whose streams send a role-only chunk before their script."""

    async def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        yield Batch([role_chunk(target.endpoint)])
        async for batch in super().stream(target, body):
            yield batch


@pytest.fixture
def adapter(clock: FakeClock) -> ScriptedAdapter:
    return RoleFirst(clock)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def heard(bus: InProcessBus) -> AsyncIterator[Heard]:
    h = Heard(bus)
    async with bus.subscribe(subjects.PREFIX + ".>") as sub:
        h._sub = sub
        yield h


@pytest.fixture
def h(bus: InProcessBus, adapter: ScriptedAdapter, clock: FakeClock, heard: Heard) -> Harness:
    return Harness(bus, adapter, clock, heard)


def hedged(after_ms: float) -> RoutePlan:
    return RoutePlan(model="m", candidates=(cand("a"), cand("b")), hedge_after_ms=after_ms)


async def test_an_unhedged_stream_relays_its_role_chunk_at_once_and_times_ttft_at_its_token(
    h: Harness,
) -> None:
    h.adapter.scripts = {"a": [Answer(takes=0.1)]}

    attempt = await h.dispatcher().open_stream(h.info(stream=True), plan(cand("a")), {})
    assert list(attempt.first) == [role_chunk("a")]  # committed at its first chunk, as before
    async for _ in attempt.batches():
        pass
    await attempt.close("success")

    (obs,) = (await h.heard.drain()).observations()
    assert obs.ttft_ms == pytest.approx(100.0)


async def test_a_hedged_primary_holds_its_role_chunk_until_its_token_and_relays_both(
    h: Harness,
) -> None:
    h.adapter.scripts = {"a": [Answer(text="from a", takes=0.1)]}

    endpoint, chunks = await h.stream(hedged(60_000.0))

    assert endpoint == "a" and h.adapter.calls == ["a"]
    assert chunks[0] == role_chunk("a") and chunks[1]["choices"][0]["delta"]["content"] == "from a"
    (obs,) = (await h.heard.drain()).observations()
    assert obs.ttft_ms == pytest.approx(100.0)


async def test_a_hedged_primary_with_only_a_role_chunk_loses_to_a_backup_with_a_token(
    h: Harness,
) -> None:
    h.adapter.scripts = {"a": [Hang()], "b": [Answer(text="from b")]}

    endpoint, chunks = await h.stream(hedged(0.0))

    assert endpoint == "b"
    assert chunks[0] == role_chunk("b") and role_chunk("a") not in chunks
    seen = {o.endpoint: (o.outcome, o.error_kind) for o in (await h.heard.drain()).observations()}
    assert seen == {"a": ("cancelled", "hedge_declined"), "b": ("success", "")}


@pytest.mark.parametrize(
    ("limits", "kind"),
    [({"ttft": SHORT, "idle": 30.0}, "ttft"), ({"ttft": 30.0, "idle": SHORT}, "idle")],
    ids=["first-byte-limit", "idle-limit"],
)
async def test_a_hedged_primary_stalling_after_its_role_chunk_fails_and_the_backup_serves(
    h: Harness, limits: dict[str, float], kind: str
) -> None:
    h.targets = FixedTargets(**limits)
    h.adapter.scripts = {"a": [Hang()], "b": [Answer()]}

    endpoint, _ = await h.stream(hedged(60_000.0))  # only the primary's failure starts b

    assert endpoint == "b"
    seen = {o.endpoint: (o.outcome, o.error_kind) for o in (await h.heard.drain()).observations()}
    assert seen == {"a": ("failure", kind), "b": ("success", "")}


async def test_a_hedged_primary_failing_after_its_role_chunk_leaves_the_race_to_the_backup(
    h: Harness,
) -> None:
    h.adapter.scripts = {"a": [Fail(503)], "b": [Answer()]}

    endpoint, chunks = await h.stream(hedged(60_000.0))

    assert endpoint == "b" and role_chunk("a") not in chunks
    seen = {o.endpoint: (o.outcome, o.error_kind) for o in (await h.heard.drain()).observations()}
    assert seen == {"a": ("failure", "http_503"), "b": ("success", "")}
