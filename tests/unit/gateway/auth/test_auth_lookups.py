"""The ingress's key lookups under a flood of cache misses: one request per hash however many
callers miss it at once, at most ``LOOKUPS_MAX`` hashes asked at once (beyond: 503
``auth_busy`` with Retry-After, nothing sent), and an answer for a key forgotten while it was
asked is given to its waiters but not cached. The key owner is played by the test on a real
in-process bus, answering when the test says."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from bus import Envelope, InProcessBus
from gateway.auth.gate import JOIN_S, LOOKUPS_MAX, Authenticator
from gateway.http.errors import http_status, retry_after_header
from schemas import ApiKeyInfo, ApiKeyLookup, AuthBusyError, UnauthorizedError, subjects
from schemas.config import GatewayConfig
from schemas.keys import hash_key
from tests.unit.gateway.auth.test_auth import request

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

WAIT = 10.0
ACTIVE = ApiKeyInfo(found=True, key_id="k1", role="pro", org="o", user="u")


class HeldOwner:
    """Takes every key lookup and answers only when told (:meth:`answer`)."""

    def __init__(self) -> None:
        self.asked: asyncio.Queue[Envelope] = asyncio.Queue()
        self.count = 0

    async def run(self, bus: InProcessBus, ready: asyncio.Event) -> None:
        async with bus.subscribe(subjects.AUTH_KEYS_LOOKUP) as sub:
            ready.set()
            async for env in sub:
                self.count += 1
                await self.asked.put(env)

    async def next(self) -> Envelope:
        return await asyncio.wait_for(self.asked.get(), WAIT)


@pytest.fixture
async def held() -> AsyncIterator[tuple[InProcessBus, HeldOwner]]:
    bus, owner, ready = InProcessBus(), HeldOwner(), asyncio.Event()
    task = asyncio.create_task(owner.run(bus, ready))
    await asyncio.wait_for(ready.wait(), WAIT)
    yield bus, owner
    task.cancel()
    await bus.aclose()


class Clock:
    """Monotonic seconds the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def gate(
    bus: InProcessBus, cache_seconds: float = 3600, clock: Clock | None = None
) -> Authenticator:
    config = {"auth": "required", "auth_cache_seconds": cache_seconds}
    return Authenticator(bus, GatewayConfig.model_validate(config), clock=clock or Clock())


async def test_callers_missing_one_key_at_once_share_one_lookup(
    held: tuple[InProcessBus, HeldOwner],
) -> None:
    bus, owner = held
    g = gate(bus)
    callers = [
        asyncio.create_task(g.gate(request("/v1/models", "llmgw-made-up"))) for _ in range(20)
    ]
    asked = await owner.next()
    await asked.respond(ApiKeyInfo(found=False))
    outcomes = await asyncio.gather(*callers, return_exceptions=True)

    assert asked.message == ApiKeyLookup(key_hash=hash_key("llmgw-made-up"))
    assert all(isinstance(o, UnauthorizedError) for o in outcomes), outcomes
    assert owner.count == 1 and owner.asked.empty()


async def test_a_flood_of_distinct_keys_is_bounded_and_the_excess_told_to_retry(
    held: tuple[InProcessBus, HeldOwner],
) -> None:
    bus, owner = held
    g = gate(bus)
    flood = [
        asyncio.create_task(g.gate(request("/v1/models", f"llmgw-made-up-{i}")))
        for i in range(LOOKUPS_MAX)
    ]
    asked = [await owner.next() for _ in range(LOOKUPS_MAX)]

    with pytest.raises(AuthBusyError) as busy:
        await g.gate(request("/v1/models", "llmgw-one-more"))
    sent_while_full = owner.count
    # A caller missing a key already being asked still joins that lookup.
    joined = asyncio.create_task(g.gate(request("/v1/models", "llmgw-made-up-0")))
    for env in asked:
        await env.respond(ApiKeyInfo(found=False))
    outcomes = await asyncio.gather(*flood, joined, return_exceptions=True)
    # Slots are free again once answered.
    later = asyncio.create_task(g.gate(request("/v1/models", "llmgw-one-more")))
    await (await owner.next()).respond(ACTIVE)
    await later

    assert sent_while_full == LOOKUPS_MAX
    assert (http_status(busy.value), retry_after_header(busy.value)) == (503, b"1")
    assert all(isinstance(o, UnauthorizedError) for o in outcomes), outcomes
    assert owner.count == LOOKUPS_MAX + 1


async def test_an_answer_for_a_key_forgotten_while_asked_is_not_cached(
    held: tuple[InProcessBus, HeldOwner],
) -> None:
    bus, owner = held
    g = gate(bus)
    first = asyncio.create_task(g.identify(request("/v1/models", "llmgw-k"), strict=True))
    asked = await owner.next()
    g.forget(hash_key("llmgw-k"))  # what an ApiKeyRevoked event does
    await asked.respond(ACTIVE)
    caller = await first  # asked before the revocation was seen: answered as it stood
    again = asyncio.create_task(g.identify(request("/v1/models", "llmgw-k"), strict=True))
    await (await owner.next()).respond(ApiKeyInfo(found=True, key_id="k1", revoked=1.0))

    assert caller is not None and caller.key_id == "k1"
    with pytest.raises(UnauthorizedError, match="revoked"):
        await again


async def test_a_caller_that_goes_away_does_not_end_the_lookup_others_wait_on(
    held: tuple[InProcessBus, HeldOwner],
) -> None:
    bus, owner = held
    g = gate(bus, cache_seconds=0)  # no cache: the staying caller can only join the lookup
    leaving = asyncio.create_task(g.identify(request("/v1/models", "llmgw-k"), strict=True))
    asked = await owner.next()
    staying = asyncio.create_task(g.identify(request("/v1/models", "llmgw-k"), strict=True))
    leaving.cancel()
    await asked.respond(ACTIVE)
    caller = await staying

    assert caller is not None and caller.key_id == "k1"
    assert leaving.cancelled() and owner.count == 1


async def test_a_caller_does_not_join_a_lookup_older_than_join_s_and_asks_the_owner_again(
    held: tuple[InProcessBus, HeldOwner],
) -> None:
    bus, owner = held
    clock = Clock()
    g = gate(bus, cache_seconds=0, clock=clock)
    # Taken by an owner that then died: never answered, it would fail at its timeout.
    stuck = asyncio.create_task(g.identify(request("/v1/models", "llmgw-k"), strict=True))
    await owner.next()
    clock.now += JOIN_S / 2
    joining = asyncio.create_task(g.identify(request("/v1/models", "llmgw-k"), strict=True))
    await asyncio.sleep(0)  # one turn of the loop: it reaches the lookup at this instant
    clock.now += JOIN_S
    later = asyncio.create_task(g.identify(request("/v1/models", "llmgw-k"), strict=True))
    await (await owner.next()).respond(ACTIVE)  # the owner now (the takeover's)
    caller = await later

    assert caller is not None and caller.key_id == "k1"
    assert owner.count == 2  # the one joining within JOIN_S asked nothing
    assert not stuck.done() and not joining.done()
    stuck.cancel()
    joining.cancel()
