"""Database provider keys' secrets reach the ingress only as grants from the KeyRegistryActor:
one credential id per request, short-lived, dropped when the registry no longer declares it."""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING

import anyio
import pytest

from actors import ChildSpec, Supervisor
from actors.keyregistry import SECRET_GRANT_TTL_S, KeyRegistryActor, PoolRoute
from bus import InProcessBus, Subscription
from gateway.admin.http import admin_request
from gateway.auth.provider_secrets import ProviderSecrets
from gateway.ingress.plan_walk import Targets
from schemas import (
    InvalidRequestError,
    KeyDeclarations,
    ProviderSecretGrant,
    ProviderSecretRequest,
    RouteCandidate,
    RouteNotFoundError,
    RoutePlan,
    raise_for_reply,
    subjects,
)
from schemas.config import GatewayConfig, credential_id

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

EID = "m:local-9001"
SECRET = "sk-db-added"
WAIT = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[InProcessBus]:
    """A bus with the key registry running on its own file (no pools to wait for)."""
    b = InProcessBus()
    registry = functools.partial(
        KeyRegistryActor,
        str(tmp_path / "gw.sqlite3"),
        pools=(PoolRoute(EID, "http://127.0.0.1:9001/v1"),),
        apply_timeout=0.0,
    )
    root = Supervisor("test", children=[ChildSpec("keys", registry)])
    await root.start(b)
    yield b
    await root.stop()
    await b.aclose()


def plan(*cids: str) -> RoutePlan:
    return RoutePlan(
        model="m",
        candidates=tuple(
            RouteCandidate(
                endpoint=EID,
                kind="openai_compat",
                base_url="http://127.0.0.1:9001/v1",
                credential_id=cid,
            )
            for cid in cids
        ),
    )


async def declarations(sub: Subscription) -> KeyDeclarations:
    with anyio.fail_after(WAIT):
        async for env in sub:
            if isinstance(env.message, KeyDeclarations):
                return env.message
    raise AssertionError("subscription ended")


async def test_registry_grants_one_database_secret_by_id_and_refuses_unknown_ids(
    bus: InProcessBus,
) -> None:
    await admin_request(
        bus, "provider_keys", "add", {"key": SECRET, "endpoint": EID}, by="test", timeout=WAIT
    )
    cid = credential_id(SECRET)
    grant = raise_for_reply(
        await bus.request(
            subjects.KEYS_SECRET_GRANT,
            ProviderSecretRequest(credential_id=cid),
            reply_type=ProviderSecretGrant,
            timeout=WAIT,
        )
    )
    assert (grant.credential_id, grant.secret, grant.ttl_seconds) == (
        cid,
        SECRET,
        SECRET_GRANT_TTL_S,
    )
    assert SECRET not in repr(grant)
    with pytest.raises(RouteNotFoundError):
        raise_for_reply(
            await bus.request(
                subjects.KEYS_SECRET_GRANT,
                ProviderSecretRequest(credential_id="k-nope"),
                reply_type=ProviderSecretGrant,
                timeout=WAIT,
            )
        )


async def test_ingress_asks_once_per_grant_lifetime_and_forgets_a_deleted_key(
    bus: InProcessBus,
) -> None:
    clock = Clock()
    secrets = ProviderSecrets(bus, {"k-configured"}, clock=clock)
    targets = Targets(GatewayConfig.model_validate({}), secrets)
    await secrets.start()
    try:
        added = await admin_request(
            bus, "provider_keys", "add", {"key": SECRET, "endpoint": EID}, by="test", timeout=WAIT
        )
        cid = credential_id(SECRET)
        async with bus.subscribe(subjects.KEYS_SECRET_GRANT) as asked:
            await secrets.ensure(plan(cid, "k-configured", "k-unknown"))
            await secrets.ensure(plan(cid, "k-unknown"))  # both remembered: no new request
            clock.now += SECRET_GRANT_TTL_S  # the grant ran out: the next plan asks again
            await secrets.ensure(plan(cid))
            seen: list[str] = []
            with anyio.fail_after(WAIT):
                async for env in asked:
                    assert isinstance(env.message, ProviderSecretRequest)
                    seen.append(env.message.credential_id)
                    if len(seen) == 3:
                        break
        assert seen == [cid, "k-unknown", cid]  # never the configured id
        assert targets.resolve(plan(cid).candidates[0]).api_key == SECRET
        async with bus.subscribe(subjects.KEYS_DECLARATIONS) as decls:
            await admin_request(
                bus, "provider_keys", "delete", {"id": added["id"]}, by="test", timeout=WAIT
            )
            assert (await declarations(decls)).db_keys == ()
        # The follower saw the same announcement; a round trip on the bus lets it run.
        await bus.request(
            subjects.KEYS_SECRET_GRANT,
            ProviderSecretRequest(credential_id=cid),
            reply_type=ProviderSecretGrant,
            timeout=WAIT,
        )
        assert secrets.get(cid) is None
        assert targets.resolve(plan(cid).candidates[0]).api_key is None
    finally:
        await secrets.aclose()


async def test_registry_takes_a_secret_of_kilobytes_but_no_name_of_more_than_a_line(
    bus: InProcessBus,
) -> None:
    # A cloud token runs to a few KiB: the cap on names must not refuse it.
    token = "ya29." + "t" * 3000
    added = await admin_request(
        bus, "provider_keys", "add", {"key": token, "endpoint": EID}, by="test", timeout=WAIT
    )
    with pytest.raises(InvalidRequestError) as refused:
        await admin_request(
            bus, "provider_keys", "delete", {"id": "k" * 300}, by="test", timeout=WAIT
        )

    assert added["id"].startswith("pk-") and token not in json.dumps(added)
    assert refused.value.param == "id" and "k" * 300 not in str(refused.value)
