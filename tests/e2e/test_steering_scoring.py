"""Scoring through the real server: evidence learned from live traffic moves ``auto:fastest``
and ``auto:reliable``; the allowance guardrail moves traffic as usage nears the allowance
(counted once per attempt, this calendar month, kept across a restart); the rate-limit
penalty after a 429 and its decay on the actors' injected clock; exploration off while
degraded. Each test waits until ``POST /admin/routing/explain`` — the live path's own
resolution — shows what the evidence events carried, never on sleeps. On ``inproc://`` and
on NATS."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest

from schemas import ModeChanged, subjects
from tests.e2e.conftest import CHAT, HI, WAIT, SkewedClock, config, model, route, watch
from tests.fixtures.upstream import Reply, UpstreamFactory

if TYPE_CHECKING:
    from collections.abc import Callable

    import httpx

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

ADMIN = "adm-scoring"
AUTH = {"authorization": f"Bearer {ADMIN}"}
CALM = {"failure_threshold": 100, "cooldown_seconds": 30}
ROUTING = {"affinity": {"enabled": False}, "bench": {"failures": 100}}


def _config(
    *models: dict[str, Any], steering: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    return config(
        *models,
        admin_key=ADMIN,
        circuit=extra.pop("circuit", CALM),
        routing=extra.pop("routing", ROUTING),
        steering={"exploration": 0, **(steering or {})},
        **extra,
    )


async def _explain(gw: RunningGateway, name: str) -> dict[str, Any]:
    resp = await gw.http().post(
        "/admin/routing/explain",
        headers=AUTH,
        json={"path": CHAT, "body": {"model": name, "messages": HI}},
    )
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()
    return result


async def _until(
    gw: RunningGateway, name: str, ok: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Explain ``name`` again until the view shows what ``ok`` waits for (evidence arrives
    by events)."""
    with anyio.fail_after(WAIT):
        while not ok(answer := await _explain(gw, name)):
            pass
    return answer


def _cand(answer: dict[str, Any], model_id: str) -> dict[str, Any]:
    return next(c for c in answer["candidates"] if c["model"] == model_id)


async def _serve(client: httpx.AsyncClient, name: str, status: int = 200) -> str:
    resp = await client.post(CHAT, json={"model": name, "messages": HI})
    assert resp.status_code == status, resp.text
    return str(resp.json()["model"]) if status == 200 else ""


async def test_a_slow_upstream_loses_auto_fastest_once_evidence_accrues(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    slow, quick = await fake_upstreams("slow"), await fake_upstreams("quick")
    slow.set_default(Reply(delay=0.2))
    gw = await gateway_factory(_config(model("s", route(slow)), model("q", route(quick))))
    http = gw.http()

    before = await _serve(http, "auto:fastest")  # no evidence: neutral, catalogue order
    for _ in range(3):
        await _serve(http, "q")
    after = await _until(gw, "auto:fastest", lambda e: e["order"][0] == "q")
    served = await _serve(http, "auto:fast")

    assert before == "s"
    assert _cand(after, "q")["scores"]["speed"] == 1.0
    assert _cand(after, "s")["scores"]["speed"] < 0.5
    assert served == "q"


async def test_a_failing_upstream_loses_auto_reliable(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    bad, good = await fake_upstreams("bad"), await fake_upstreams("good")
    bad.set_default(Reply(500))
    gw = await gateway_factory(_config(model("x", route(bad)), model("y", route(good))))
    http = gw.http()

    for _ in range(2):
        await _serve(http, "x", 502)
    after = await _until(gw, "auto:reliable", lambda e: e["order"][0] == "y")
    served = await _serve(http, "auto:reliable")

    # y has no evidence yet: neutral, which beats a record of failures.
    assert _cand(after, "x")["scores"]["reliability"] < 0.5
    assert _cand(after, "y")["scores"]["reliability"] == 0.5
    assert served == "y" and len(good.requests) == 1


async def test_the_allowance_guardrail_moves_traffic_as_usage_nears_the_allowance(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    free, paid = await fake_upstreams("free"), await fake_upstreams("paid")
    # 15 tokens an answer (10 prompt + 5 completion): 4 answers use the 60 up.
    cfg = _config(
        model("f", route(free), catalog={"tier": 2, "free_allowance": {"monthly_tokens": 60}}),
        model("p", route(paid)),
    )
    gw = await gateway_factory(cfg)
    http = gw.http()

    early = [await _serve(http, "auto") for _ in range(3)]  # 45 of 60: below the threshold
    three = await _until(gw, "auto", lambda e: _cand(e, "f")["allowance_used"] == 0.75)
    await _serve(http, "f")
    used_up = await _until(gw, "auto", lambda e: _cand(e, "f")["allowance_used"] == 1.0)
    moved = await _serve(http, "auto")
    usage = (await http.post("/admin/steering/get", headers=AUTH)).json()["evidence"]["f"]
    await gw.stop()
    again = await gateway_factory(cfg)
    kept = (await again.http().post("/admin/steering/get", headers=AUTH)).json()

    assert early == ["f"] * 3
    assert _cand(three, "f")["multipliers"]["allowance"] == 1.0
    assert _cand(used_up, "f")["multipliers"]["allowance"] == pytest.approx(0.2)
    assert used_up["order"] == ["p", "f"] and moved == "p"
    assert (usage["tokens_used"], usage["requests_used"]) == (60, 4)
    assert (kept["evidence"]["f"]["tokens_used"], kept["evidence"]["f"]["requests_used"]) == (60, 4)


async def test_a_429_penalises_a_model_until_its_penalty_decays(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    actor_clock: SkewedClock,
) -> None:
    p, q, z = [await fake_upstreams(n) for n in "pqz"]
    gw = await gateway_factory(
        _config(
            model("p", route(p), catalog={"tier": 3}),
            model("q", route(q), catalog={"tier": 2}),
            model("z", route(z), catalog={"tier": 1}),
            steering={
                "profile": "smartest",
                "guardrails": {"rate_limit_penalty": 0.4, "rate_limit_decay_seconds": 300},
            },
        )
    )
    http = gw.http()
    p.enqueue(Reply(429))

    over = await _serve(http, "auto")  # p answers 429: the walk goes on to q
    tried = len(p.requests)
    penalised = await _until(gw, "auto", lambda e: e["order"][0] == "q")
    actor_clock.advance(200)  # two thirds of the decay: 0.4 + 0.6 * 2/3 = 0.8
    decayed = await _until(gw, "auto", lambda e: e["order"][0] == "p")
    back = await _serve(http, "auto")

    assert over == "q" and tried == 1
    assert _cand(penalised, "p")["multipliers"]["rate_limit"] == pytest.approx(0.4, abs=0.01)
    assert _cand(decayed, "p")["multipliers"]["rate_limit"] == pytest.approx(0.8, abs=0.01)
    assert back == "p"


async def test_a_429_is_back_pressure_never_a_models_unreliability(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    # The rate-limit penalty is what a 429 costs a model's score; its reliability fell as
    # for a 5xx as well, so a burst (one caller's, say) that a provider pushed back on
    # ranked the model down for everyone long after the penalty wore off.
    p, q, sick = [await fake_upstreams(n) for n in ("p", "q", "sick")]
    sick.set_default(Reply(500))
    gw = await gateway_factory(
        _config(
            model("p", route(p), catalog={"tier": 3}),
            model("q", route(q), catalog={"tier": 2}),
            model("ill", route(sick), catalog={"tier": 1}),
            steering={"profile": "smartest", "guardrails": {"rate_limit_penalty": 0.4}},
        )
    )
    http = gw.http()
    p.enqueue(Reply(429))

    over = await _serve(http, "auto")  # p answers 429: the walk goes on to q
    penalised = await _until(gw, "auto", lambda e: e["order"][0] == "q")
    await _serve(http, "ill", 502)  # a 5xx, for comparison
    sickly = await _until(gw, "auto", lambda e: _cand(e, "ill")["scores"]["reliability"] < 0.5)

    assert over == "q"
    assert _cand(penalised, "p")["multipliers"]["rate_limit"] < 1.0
    assert _cand(penalised, "p")["scores"]["reliability"] == pytest.approx(0.5)
    assert _cand(sickly, "ill")["scores"]["reliability"] == pytest.approx(0.4)


async def test_exploration_is_off_while_degraded(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c, sick = [await fake_upstreams(n) for n in ("a", "b", "c", "sick")]
    sick.set_default(Reply(500))
    gw = await gateway_factory(
        _config(
            model("a", route(a), catalog={"tier": 3}),
            model("b", route(b)),
            model("c", route(c)),
            model("ill", route(sick), catalog={"enabled": False}),
            steering={"exploration": 1.0},
            routing={
                "affinity": {"enabled": False},
                "bench": {"failures": 1, "duration_seconds": 600},
                "degraded": {
                    "threshold": 0.9,
                    "entry_seconds": 0,
                    "exit_seconds": 600,
                    "pass_interval_seconds": 0.05,
                },
            },
        )
    )
    http = gw.http()

    exploring = {await _serve(http, "auto") for _ in range(12)}  # all alike: 1 in 2048
    async with watch(gw, subjects.event("mode")) as modes:
        await _serve(http, "ill", 502)  # its only route is benched: 3 of 4 healthy
        await modes.next(ModeChanged, lambda m: m.mode == "degraded")
    await _until(gw, "auto", lambda e: e["degraded"])
    degraded = [await _serve(http, "auto") for _ in range(12)]

    assert exploring == {"b", "c"}  # exploration always: never the best while normal
    assert degraded == ["a"] * 12 and len(a.requests) == 12


async def test_least_remaining_quota_spends_the_key_with_the_least_allowance_left_first(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    up = await fake_upstreams("up")
    keys = [
        {"key": "sk-roomy", "free_allowance": {"monthly_requests": 10}},
        {"key": "sk-nearly", "free_allowance": {"monthly_requests": 2}},
        "sk-paid",
    ]
    cfg = _config(model("m", route(up, api_keys=keys), credential_choice="least_remaining_quota"))
    gw = await gateway_factory(cfg)
    http = gw.http()

    for _ in range(4):
        await _serve(http, "m")
    first = [r.credential for r in up.requests]
    await gw.stop()
    again = await gateway_factory(cfg)  # the usage is kept across a restart
    await _serve(again.http(), "m")

    # nearly: 2 left, spent first; then roomy (10 left, now the least); paid has none.
    assert first == ["sk-nearly", "sk-nearly", "sk-roomy", "sk-roomy"]
    assert up.requests[-1].credential == "sk-roomy"


async def test_an_explored_request_does_not_move_the_caller_off_its_model(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    gw = await gateway_factory(
        _config(
            model("a", route(a), catalog={"tier": 3}),
            model("b", route(b)),
            model("c", route(c)),
            steering={"exploration": 1.0},
            routing={"affinity": {"enabled": True}, "bench": {"failures": 100}},
        )
    )
    http = gw.http()

    explored = await _serve(http, "auto")  # exploration always: never the best
    changed = await http.post(
        "/admin/steering/set_exploration", headers=AUTH, json={"exploration": 0}
    )
    assert changed.status_code == 200, changed.text
    await _until(gw, "auto", lambda e: e["exploration"] == 0)
    after = await _serve(http, "auto")

    assert explored in {"b", "c"}
    assert after == "a"  # the explored model was one sample, not the caller's new home


async def test_a_steered_pin_keeps_a_conversation_not_every_caller_behind_its_address(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    """Evidence moves ``auto:reliable`` from x to y: the conversation x served stays there
    (its prompt cache is warm on x), another conversation from the same address follows the
    new order."""
    shaky, good = await fake_upstreams("shaky"), await fake_upstreams("good")
    gw = await gateway_factory(
        _config(
            model("x", route(shaky)),
            model("y", route(good)),
            routing={
                "affinity": {"enabled": True},
                "bench": {"failures": 100},
                "trust_proxy_headers": True,
            },
        )
    )
    http = gw.http()

    async def pick(opening: str) -> str:
        resp = await http.post(
            CHAT,
            json={"model": "auto:reliable", "messages": [{"role": "user", "content": opening}]},
            headers={"x-forwarded-for": "10.0.0.1"},
        )
        assert resp.status_code == 200, resp.text
        return str(resp.json()["model"])

    first = await pick("a story, please")  # no evidence: neutral, catalogue order
    # Five failures: x's reliability stays under y's through the two answers below.
    shaky.enqueue(*[Reply(500)] * 5)
    for _ in range(5):
        await _serve(http, "x", 502)
    await _until(gw, "auto:reliable", lambda e: e["order"][0] == "y")
    same = [await pick("a story, please") for _ in range(2)]
    other = await pick("a poem, please")

    assert first == "x"
    assert same == ["x", "x"]  # x answers again: the conversation stays where it started
    assert other == "y"  # a new conversation behind the same address: the new order


async def test_auto_reliable_leaves_a_failing_model_within_two_of_the_next_ten_requests(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    """The failures that put x behind y reach the ingress at once, not an interval later."""
    shaky, good = await fake_upstreams("shaky"), await fake_upstreams("good")
    gw = await gateway_factory(_config(model("x", route(shaky)), model("y", route(good))))
    http = gw.http()

    warm = [await _serve(http, "auto:reliable") for _ in range(3)]
    shaky.set_default(Reply(500))
    for _ in range(3):
        await _serve(http, "x", 502)
    sent = len(shaky.requests)
    after = [await _serve(http, "auto:reliable") for _ in range(10)]

    assert warm == ["x"] * 3  # no evidence against it yet: catalogue order
    assert after == ["y"] * 10  # a request that tried x first failed over to y
    assert len(shaky.requests) - sent <= 2  # at most 2 of the 10 still followed the old order


async def test_degraded_mode_stops_exploration_within_two_of_the_next_ten_requests(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    """The mode reaches the ingress with the mode change, not with the next evidence."""
    a, b, c, sick = [await fake_upstreams(n) for n in ("a", "b", "c", "sick")]
    sick.set_default(Reply(500))
    gw = await gateway_factory(
        _config(
            model("a", route(a), catalog={"tier": 3}),
            model("b", route(b)),
            model("c", route(c)),
            model("ill", route(sick), catalog={"enabled": False}),
            steering={"exploration": 1.0},
            routing={
                "affinity": {"enabled": False},
                "bench": {"failures": 1, "duration_seconds": 600},
                "degraded": {
                    "threshold": 0.9,
                    "entry_seconds": 0,
                    "exit_seconds": 600,
                    "pass_interval_seconds": 0.05,
                },
            },
        )
    )
    http = gw.http()

    async with watch(gw, subjects.event("mode")) as modes:
        await _serve(http, "ill", 502)  # its only route is benched: 3 of 4 healthy
        await modes.next(ModeChanged, lambda m: m.mode == "degraded")
    after = [await _serve(http, "auto") for _ in range(10)]

    assert sum(m != "a" for m in after) <= 2  # explored: at most 2 of the 10
