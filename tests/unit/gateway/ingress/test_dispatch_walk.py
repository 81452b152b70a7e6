"""The failover loop across a walk of several models: every lease a walked model's plan
hands out is given back, attempted or not. Real in-process bus, real adapters, a fake
upstream over loopback HTTP."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from gateway.adapters.registry import make_adapters, make_http_client
from gateway.ingress.dispatch import Dispatcher
from gateway.ingress.plan_walk import PlanWalk, Targets
from gateway.ingress.request_info import RequestInfo
from schemas import FirstToken, Message, Observation, RouteCandidate, RoutePlan, subjects
from schemas.config import FailoverConfig, GatewayConfig, ModelConfig
from tests.fixtures.upstream import FakeUpstream, Reply

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from bus import InProcessBus
    from gateway.adapters.base import Adapter, UpstreamTarget

HI = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
_CONTEXT_REFUSAL = {
    "error": {"message": "maximum context length exceeded", "code": "context_length_exceeded"}
}


@pytest.fixture
async def adapters() -> AsyncIterator[dict[str, Adapter]]:
    http = make_http_client()
    yield make_adapters(http)
    await http.aclose()


class _Heard:
    """What the bus carried on the subjects a test listens to, in order."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, Message]] = []

    def first_tokens(self, model: str) -> list[str]:
        """The endpoints whose prefill lease of ``model`` was released by a FirstToken."""
        subject = subjects.model_first_token(model)
        return [m.endpoint for s, m in self.messages if isinstance(m, FirstToken) and s == subject]

    def observations(self) -> list[tuple[str, str, bool]]:
        return [
            (m.endpoint, m.outcome, m.probe) for _, m in self.messages if isinstance(m, Observation)
        ]


def _openai(up: FakeUpstream, endpoint: str, **kw: Any) -> RouteCandidate:
    return RouteCandidate(
        endpoint=endpoint,
        kind="openai_compat",
        base_url=up.openai_base_url,
        upstream_model="m",
        **kw,
    )


def _echo(endpoint: str, **kw: Any) -> RouteCandidate:
    return RouteCandidate(endpoint=endpoint, kind="echo", **kw)


async def _run(
    bus: InProcessBus,
    adapters: dict[str, Adapter],
    plans: dict[str, RoutePlan],
    *,
    stream: bool,
    failover: FailoverConfig | None = None,
    started: float | None = None,
) -> tuple[_Heard, list[str], str]:
    """Serve one request over the walk of ``plans``' models; what the bus heard, which
    models were asked for a plan, and the endpoint that served."""
    heard = _Heard()
    asked: list[str] = []
    endpoints = [c.endpoint for p in plans.values() for c in p.candidates]
    info = RequestInfo(request_id="req", surface="chat", stream=stream)
    if started is not None:
        info.started = started

    async def ask(model: ModelConfig) -> RoutePlan:
        asked.append(model.id)
        return plans[model.id]

    models = tuple(ModelConfig.model_validate({"id": m}) for m in plans)
    walk = PlanWalk(models, ask)
    dispatcher = Dispatcher(bus, adapters, Targets(GatewayConfig.model_validate({})), failover)
    subs = [bus.subscribe(subjects.observation(e)) for e in endpoints]
    subs += [bus.subscribe(subjects.model_first_token(m)) for m in plans]
    entered = [await s.__aenter__() for s in subs]
    try:
        plan = await walk.first()
        served = ""
        try:
            if stream:
                attempt = await dispatcher.open_stream(info, plan, HI, walk)
                await attempt.close("success")
                served = attempt.candidate.endpoint
            else:

                async def op(adapter: Adapter, target: UpstreamTarget, model: str) -> Any:
                    return await adapter.complete(target, HI)

                served = (await dispatcher.call(info, plan, op, walk)).candidate.endpoint
        except Exception:
            pass
        for sub in entered:
            while sub.pending:
                env = await anext(aiter(sub))
                heard.messages.append((env.subject, env.message))
    finally:
        for s in subs:
            await s.__aexit__(None, None, None)
    return heard, asked, served


async def test_a_walked_primary_ruled_out_by_a_context_refusal_gives_back_its_leases(
    bus: InProcessBus, adapters: dict[str, Adapter], fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(Reply(400, body=_CONTEXT_REFUSAL))
    plans = {
        "a": RoutePlan(model="a", candidates=(_openai(fake_upstream, "a/0", context_window=1000),)),
        "b": RoutePlan(
            model="b", candidates=(_echo("b/0", context_window=1000, probe=True), _echo("b/1"))
        ),
        "c": RoutePlan(model="c", candidates=(_echo("c/0", context_window=500), _echo("c/1"))),
    }

    heard, asked, served = await _run(bus, adapters, plans, stream=False)

    assert served == "b/1"
    assert asked == ["a", "b"]
    # b/0 was the probe, never sent: its cancelled observation gives the probe back.
    assert heard.observations() == [
        ("a/0", "client_error", False),
        ("b/0", "cancelled", True),
        ("b/1", "success", False),
    ]


async def test_a_walked_plain_primary_ruled_out_releases_its_prefill_lease(
    bus: InProcessBus, adapters: dict[str, Adapter], fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(Reply(400, body=_CONTEXT_REFUSAL))
    plans = {
        "a": RoutePlan(model="a", candidates=(_openai(fake_upstream, "a/0", context_window=1000),)),
        "b": RoutePlan(model="b", candidates=(_echo("b/0", context_window=800), _echo("b/1"))),
    }

    heard, _, served = await _run(bus, adapters, plans, stream=False)

    assert served == "b/1"
    assert heard.first_tokens("b") == ["b/0"]
    assert ("b/0", "cancelled", False) not in heard.observations()  # not an attempt


async def test_no_plan_is_fetched_once_the_budget_is_spent(
    bus: InProcessBus, adapters: dict[str, Adapter], fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(Reply(500), Reply(500))
    plans = {
        "a": RoutePlan(
            model="a", candidates=(_openai(fake_upstream, "a/0"), _openai(fake_upstream, "a/1"))
        ),
        "b": RoutePlan(model="b", candidates=(_echo("b/0", probe=True),)),
    }
    spent = time.perf_counter() - 60.0  # the request started a minute ago: budget spent

    heard, asked, served = await _run(
        bus,
        adapters,
        plans,
        stream=False,
        failover=FailoverConfig(budget_seconds=1.0),
        started=spent,
    )

    assert served == ""
    assert asked == ["a"]  # b's plan (and its probe lease) was never taken
    assert [o[0] for o in heard.observations()] == ["a/0", "a/1"]


async def test_a_walked_models_stream_releases_its_prefill_lease_at_the_first_chunk(
    bus: InProcessBus, adapters: dict[str, Adapter], fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(Reply(500))
    plans = {
        "a": RoutePlan(model="a", candidates=(_openai(fake_upstream, "a/0"),)),
        "b": RoutePlan(model="b", candidates=(_echo("b/0"), _echo("b/1"))),
    }

    heard, _, served = await _run(bus, adapters, plans, stream=True)

    assert served == "b/0"
    assert heard.first_tokens("b") == ["b/0"]


def _keys_tried(heard: _Heard) -> list[tuple[str, str]]:
    return [(m.endpoint, m.credential_id) for _, m in heard.messages if isinstance(m, Observation)]


async def test_a_refused_key_is_retried_on_its_routes_spare_key_and_a_sick_route_is_not(
    bus: InProcessBus, adapters: dict[str, Adapter], fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(Reply(500), Reply(403))
    up = fake_upstream
    plans = {
        "a": RoutePlan(
            model="a",
            candidates=(
                _openai(up, "a/0", credential_id="k1", spare_credentials=("k2",)),
                _openai(up, "a/1", credential_id="k3", spare_credentials=("k4",)),
            ),
        )
    }

    heard, _, served = await _run(bus, adapters, plans, stream=False)

    assert served == "a/1"
    # a/0's 500 says the route is sick whatever the key; a/1's 403 refused only k3.
    assert _keys_tried(heard) == [("a/0", "k1"), ("a/1", "k3"), ("a/1", "k4")]


async def test_spare_keys_are_tried_within_the_requests_attempt_cap(
    bus: InProcessBus, adapters: dict[str, Adapter], fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(Reply(401), Reply(403), Reply(401))
    keyed = _openai(fake_upstream, "a/0", credential_id="k1", spare_credentials=("k2", "k3"))
    plans = {"a": RoutePlan(model="a", candidates=(keyed, _echo("a/1")))}

    heard, _, served = await _run(
        bus, adapters, plans, stream=False, failover=FailoverConfig(max_attempts=2)
    )

    assert served == ""
    assert _keys_tried(heard) == [("a/0", "k1"), ("a/0", "k2")]
