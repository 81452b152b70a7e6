"""An upstream that echoes the credential it was sent never gets it to a client, a log line or
an event: not when its stream breaks mid-answer on any client surface (chat and responses
through the openai SDK, messages through the anthropic SDK; ``openai_compat`` and
``anthropic`` upstreams), and not when a background probe (a benched route's, a muted key's)
is refused with a 401 body naming the key. Every log record is captured (DEBUG). Runs on
``inproc://`` and NATS."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

import msgspec
import openai
import pytest

from schemas import BenchChanged, KeyMuted, subjects
from tests.e2e._surface_clients import DRIVERS
from tests.e2e.conftest import HI, anthropic_route, config, eid, gateway_bus, model, route, watch
from tests.fixtures.upstream import Reply, Stream, UpstreamFactory

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

KEY = "sk-echoed-route-key-7f3a9c"
SURFACES = ("chat", "responses", "messages")
KINDS = {"openai_compat": route, "anthropic": anthropic_route}
CALM = {"failure_threshold": 100, "cooldown_seconds": 30}
_RAW: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"model": "m", "messages": HI, "stream": True}),
    "responses": ("/v1/responses", {"model": "m", "input": "hi", "stream": True}),
    "messages": ("/v1/messages", {"model": "m", "max_tokens": 16, "messages": HI, "stream": True}),
}


def _logged(caplog: pytest.LogCaptureFixture) -> str:
    """Every captured line, with each record's raw arguments (a formatter may print them)."""
    return caplog.text + "\n".join(repr(r.args) for r in caplog.records if r.args)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("surface", SURFACES)
async def test_a_stream_broken_by_an_error_echoing_the_key_reaches_no_client_or_log_with_it(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    caplog: pytest.LogCaptureFixture,
    surface: str,
    kind: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    echoing = Stream(error_after=1, error="stream aborted for key {authorization}")
    up = await fake_upstreams("up", chunks=4, default=echoing)
    gw = await gateway_factory(config(model("m", KINDS[kind](up, api_key=KEY))))

    got, error = await DRIVERS[surface](gw).cut()
    path, body = _RAW[surface]
    async with gw.http().stream("POST", path, json=body) as resp:
        raw = (await resp.aread()).decode()

    assert KEY in (up.requests[0].headers.get("authorization") or up.requests[0].credential or "")
    assert got and "upstream stream broke" in error
    assert "stream aborted for key" in error and "[redacted]" in error
    assert KEY not in error
    assert resp.status_code == 200 and "stream aborted for key" in raw and KEY not in raw
    assert "stream from" in caplog.text  # the break was logged, without the key
    assert KEY not in _logged(caplog)


async def test_background_probes_refused_with_a_body_naming_the_key_log_and_publish_it_redacted(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    # ``k``: its sole key is muted by a 401, then its probe is refused the same way.
    # ``b``: a 500 benches the route, then its probe is refused with a 401.
    # Each probe comes 0.3 s into a 30 s mute or bench: a probe falling due after its mute
    # ended is rightly never sent, so the window must outlast a starved event loop.
    muted_key, benched_key = KEY, KEY + "-bench"
    ka, ba = await fake_upstreams("ka"), await fake_upstreams("ba")
    ka.set_default(Reply(401, body={"error": {"message": f"Incorrect API key: {muted_key}"}}))
    ba.set_default(Reply(401, body={"error": {"message": f"no such key: Bearer {benched_key}"}}))
    ba.enqueue(Reply(500))
    gw = await gateway_factory(
        config(
            model("k", route(ka, api_key=muted_key)),
            model("b", route(ba, api_key=benched_key)),
            circuit=CALM,
            routing={
                "key_pool": {"sole_key_tolerance": 0, "sole_key_backoff_seconds": 30.0},
                "bench": {"failures": 1, "duration_seconds": 30.0, "probe_after_fraction": 0.01},
            },
        )
    )
    events: list[bytes] = []

    async def record() -> None:
        async with gateway_bus(gw).subscribe("llmgw.>") as sub:
            async for env in sub:
                events.append(msgspec.json.encode(env.message))

    recorder = asyncio.create_task(record())
    client, muted, benched = gw.openai(), eid("k", ka), eid("b", ba)
    try:
        async with (
            watch(gw, subjects.event("keypool")) as keypool,
            watch(gw, subjects.event("bench")) as bench,
        ):
            for model_id in ("k", "b"):
                with pytest.raises(openai.APIStatusError):
                    await client.chat.completions.create(model=model_id, messages=HI)
            # ``b``'s own probe re-mutes its key too: wait for ``k``'s.
            reprobe = await keypool.next(
                KeyMuted, lambda e: e.pool == muted and e.reason == "probe failed"
            )
            rebench = await bench.next(
                BenchChanged,
                lambda e: e.endpoint == benched and e.reason.startswith("background probe"),
            )
    finally:
        recorder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await recorder

    probes = [r for r in (*ka.requests, *ba.requests) if r.json.get("max_tokens") == 1]
    assert {r.credential for r in probes} >= {muted_key, benched_key}
    assert reprobe.credential_id
    assert rebench.reason == "background probe failed: no such key: Bearer [redacted]"
    logged = _logged(caplog)
    assert "failed its probe: Incorrect API key: [redacted]" in logged
    assert "background probe of" in logged
    for secret in (muted_key, benched_key):
        assert secret not in logged, f"a log line carries {secret[:12]}..."
        assert not any(secret.encode() in e for e in events), f"an event carries {secret[:12]}"
