"""Client steering through the real server: ``auto``, ``auto:<axis>`` (and synonyms, any
case), ``auto:<chain>``; unknown and empty chains refused with a 400 naming them; the
failover loop walking a chain's models with the hop cap counted across them; the answer's
``model`` the public model that served on every surface; session affinity for steered
callers. On ``inproc://`` and on NATS."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anthropic
import openai
import pytest
import yaml

from schemas import ChainGet, RouteDecided, RouteRequest, subjects
from tests.e2e.conftest import CHAT, HI, assert_openai_error, config, eid, model, route, watch
from tests.e2e.keys_support import create_keys, keys_config
from tests.fixtures.gateway import REPO, GatewayFactory, RunningGateway
from tests.fixtures.upstream import FakeUpstream, Reply, UpstreamFactory

if TYPE_CHECKING:
    from pathlib import Path

    import httpx

pytestmark = pytest.mark.e2e

QUIET = {"exploration": 0}  # no exploration draws: every test's order is deterministic


def _catalogue(a: FakeUpstream, b: FakeUpstream, c: FakeUpstream, **extra: Any) -> dict[str, Any]:
    """a: the smartest; b: the biggest free allowance; c: the cheapest price."""
    return config(
        model("a", route(a), catalog={"tier": 3}),
        model("b", route(b), catalog={"tier": 2, "free_allowance": {"monthly_tokens": 10**9}}),
        model("c", route(c), catalog={"tier": 1, "price": {"input_per_mtok": 0.1}}),
        steering=extra.pop("steering", QUIET),
        **extra,
    )


async def _served(client: openai.AsyncOpenAI, name: str) -> tuple[str, str]:
    """(answer's model, x-routed-via) of one chat request for model field ``name``."""
    raw = await client.chat.completions.with_raw_response.create(model=name, messages=HI)
    return raw.parse().model, raw.headers["x-routed-via"]


async def test_every_axis_and_synonym_resolves_in_any_case(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    gw = await gateway_factory(_catalogue(a, b, c))
    client = gw.openai()

    smart = {n: await _served(client, n) for n in ("auto:smartest", "AUTO:Smart", "auto")}
    # Speed and reliability: at most a has evidence (it served everything so far), and
    # without any, ties keep catalogue order: a leads either way.
    fast = {n: await _served(client, n) for n in ("auto:fastest", "auto:fast", "auto:SPEED")}
    reliable = await _served(client, "auto:Reliable")
    cheap = {n: await _served(client, n) for n in ("auto:cheapest", "auto:CHEAP", "Auto:budget")}

    assert set(smart.values()) == {("a", eid("a", a))}
    assert set(cheap.values()) == {("b", eid("b", b))}
    assert set(fast.values()) == {("a", eid("a", a))}
    assert reliable == ("a", eid("a", a))
    assert len(c.requests) == 0


async def test_unknown_and_empty_chains_are_400s_naming_them_in_the_callers_shape(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    gw = await gateway_factory(
        _catalogue(
            a,
            b,
            c,
            chains=[
                {"name": "empty"},
                {"name": "off", "models": [{"model": "a", "enabled": False}]},
            ],
        )
    )

    with pytest.raises(openai.BadRequestError) as unknown:
        await gw.openai().chat.completions.create(model="auto:Nope", messages=HI)
    with pytest.raises(anthropic.BadRequestError) as unknown_msgs:
        await gw.anthropic().messages.create(
            model="auto:nope", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    empty = await gw.http().post(CHAT, json={"model": "auto:empty", "messages": HI})
    off = await gw.http().post(CHAT, json={"model": "auto:off", "messages": HI})

    err = assert_openai_error(unknown.value.response, 400, "invalid_request")
    assert "'nope'" in err["message"] and err["param"] == "model"
    body = unknown_msgs.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "'nope'" in body["error"]["message"]
    assert "'empty' has no enabled model" in assert_openai_error(empty, 400)["message"]
    assert "'off' has no enabled model" in assert_openai_error(off, 400)["message"]
    assert len(a.requests) + len(b.requests) + len(c.requests) == 0


async def test_a_name_no_chain_can_have_is_refused_without_asking_the_bus(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    gw = await gateway_factory(_catalogue(a, b, c))
    http = gw.http()
    hostile = "auto:" + "x" * 10_000  # as a subject it would exceed what NATS takes

    async with watch(gw, subjects.CHAIN_RESOLVE_ANY) as asked:
        refused = await http.post(CHAT, json={"model": hostile, "messages": HI})
        ghost = await http.post(CHAT, json={"model": "auto:ghost", "messages": HI})
        first_asked = await asked.next(ChainGet)
        served = await http.post(CHAT, json={"model": "a", "messages": HI})

    message = assert_openai_error(refused, 400, "invalid_request")["message"]
    assert len(message) < 1_000  # the name is quoted cut short
    assert_openai_error(ghost, 400, "invalid_request")
    assert len(asked.seen) == 1 and first_asked == ChainGet()  # only the valid name was asked
    assert served.status_code == 200


async def test_a_chain_follows_the_written_order_and_fails_over_to_its_next_model(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    gw = await gateway_factory(
        _catalogue(
            a,
            b,
            c,
            chains=[{"name": "Pair", "models": ["c", "a"]}],
            routing={"bench": {"failures": 50}},
            circuit={"failure_threshold": 50, "cooldown_seconds": 30},
        )
    )
    client = gw.openai()

    first = await _served(client, "auto:pair")
    c.set_default(Reply(500))
    async with watch(gw, subjects.event("decision")) as decisions:
        over = await _served(client, "auto:PAIR")
        decided = await decisions.next(RouteDecided)

    assert first == ("c", eid("c", c))
    assert over == ("a", eid("a", a))
    assert len(c.requests) == 2 and len(a.requests) == 1
    assert (decided.target, decided.chain, decided.ordering) == ("auto:pair", "pair", "priority")
    assert (decided.model, decided.served, decided.attempts) == ("a", eid("a", a), 2)
    assert (decided.chosen, decided.runner_up) == ("c", "a")


async def test_the_hop_cap_counts_attempts_across_the_chains_models(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, c, d = [await fake_upstreams(n) for n in "acd"]
    for up in (c, d):
        up.set_default(Reply(500))
    cfg = config(
        model("a", route(a)),
        model("c", route(c), route(d)),
        chains=[{"name": "walk", "models": ["c", "a"]}],
        steering=QUIET,
        circuit={"failure_threshold": 50, "cooldown_seconds": 30},
        routing={
            "bench": {"failures": 50},
            "failover": {"max_attempts": 2},
            "affinity": {"enabled": False},
        },
    )
    gw = await gateway_factory(cfg)

    capped = await gw.http().post(CHAT, json={"model": "auto:walk", "messages": HI})

    assert capped.status_code == 502, capped.text
    assert len(c.requests) + len(d.requests) == 2 and len(a.requests) == 0


async def test_every_surface_answers_with_the_public_model_that_served(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    gw = await gateway_factory(_catalogue(a, b, c, chains=[{"name": "two", "models": ["b"]}]))

    chat_stream = await gw.openai().chat.completions.create(
        model="auto:two", messages=HI, stream=True
    )
    chunk_models = {chunk.model async for chunk in chat_stream}
    responses = await gw.openai().responses.create(model="auto:two", input="hi")
    messages = await gw.anthropic().messages.create(
        model="Auto:Two", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    )
    async with gw.anthropic().messages.stream(
        model="auto:smartest", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        streamed = await stream.get_final_message()

    assert chunk_models == {"b"}
    assert responses.model == "b" and messages.model == "b"
    assert streamed.model == "a"


async def _pick(http: httpx.AsyncClient, ip: str, opening: str = "hi") -> str:
    """The model serving an ``auto`` request of the conversation opened by ``opening``, from
    the anonymous caller at ``ip``."""
    resp = await http.post(
        CHAT,
        json={"model": "auto", "messages": [{"role": "user", "content": opening}]},
        headers={"x-forwarded-for": ip},
    )
    assert resp.status_code == 200, resp.text
    return str(resp.json()["model"])


async def test_a_chain_reorder_moves_a_pinned_conversation_on_its_next_request(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    admin = "adm-sticky"
    gw = await gateway_factory(
        _catalogue(
            a,
            b,
            c,
            chains=[{"name": "main", "models": ["a", "b", "c"]}],
            steering={"active_chain": "main", "profile": "priority", "exploration": 0},
            routing={"trust_proxy_headers": True},
            admin_key=admin,
        )
    )
    http = gw.http()

    before = [await _pick(http, "10.0.0.1") for _ in range(2)]
    moved = await http.post(
        "/admin/chains/move",
        json={"name": "main", "model": "c", "position": 1},
        headers={"authorization": f"Bearer {admin}"},
    )
    assert moved.status_code == 200, moved.text
    after = [await _pick(http, "10.0.0.1") for _ in range(3)]

    assert before == ["a", "a"]
    assert after == ["c"] * 3  # the operator's order, from the next request on


async def test_a_profile_change_moves_a_pinned_conversation_on_its_next_request(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    admin = "adm-profile"
    gw = await gateway_factory(
        _catalogue(
            a,
            b,
            c,
            chains=[{"name": "main", "models": ["c", "b", "a"]}],
            steering={"active_chain": "main", "profile": "smartest", "exploration": 0},
            routing={"trust_proxy_headers": True},
            admin_key=admin,
        )
    )
    http = gw.http()

    before = [await _pick(http, "10.0.0.1") for _ in range(2)]
    changed = await http.post(
        "/admin/steering/set_profile",
        json={"profile": "priority"},
        headers={"authorization": f"Bearer {admin}"},
    )
    assert changed.status_code == 200, changed.text
    after = [await _pick(http, "10.0.0.1") for _ in range(3)]

    assert before == ["a", "a"]  # smartest: a, whatever the chain's order
    assert after == ["c"] * 3  # priority: the chain's written order


async def _models(gw: RunningGateway, key: str) -> list[str]:
    return [m.id for m in (await gw.openai(key).models.list()).data]


async def test_v1_models_lists_auto_the_axes_and_the_callers_chains_all_callable(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    a = await fake_upstreams("a")
    acme, other = (
        await create_keys(tmp_path, "free", org="acme"),
        await create_keys(tmp_path, "free", org="other"),
    )
    gw = await gateway_factory(
        keys_config(
            tmp_path,
            model("a", route(a)),
            chains=[
                {"name": "shared", "models": ["a"]},
                {"name": "mine", "org": "acme", "models": ["a"]},
                {"name": "theirs", "org": "other", "models": ["a"]},
            ],
            steering=QUIET,
        )
    )

    seen = await _models(gw, acme[0])
    callable_ = {n: (await _served(gw.openai(acme[0]), n))[0] for n in seen}
    with pytest.raises(openai.BadRequestError) as foreign:
        await gw.openai(acme[0]).chat.completions.create(model="auto:theirs", messages=HI)

    assert seen == [
        "a",
        "auto",
        "auto:smartest",
        "auto:fastest",
        "auto:cheapest",
        "auto:reliable",
        "auto:mine",
        "auto:shared",
    ]
    assert "auto:theirs" in await _models(gw, other[0])
    assert set(callable_.values()) == {"a"}
    assert "'theirs'" in assert_openai_error(foreign.value.response, 400)["message"]


async def test_the_readme_example_config_runs_against_the_echo_upstream(
    gateway_factory: GatewayFactory,
) -> None:
    example = yaml.safe_load((REPO / "docs" / "steering-example.yaml").read_text())
    example["steering"]["exploration"] = 0  # the example explores; this test asks for the order
    gw = await gateway_factory(yaml.safe_dump(example))
    client = gw.openai()

    served = {
        n: (await _served(client, n))[0]
        for n in ("auto:coding", "auto", "auto:cheapest", "auto:smart", "retired")
    }
    listed = [m.id for m in (await client.models.list()).data]

    assert served["auto:coding"] == "medium" and served["auto:cheapest"] == "medium"
    assert served["auto"] in {"big", "medium", "small"} and served["auto:smart"] == "big"
    assert served["retired"] == "retired"
    assert "auto:coding" in listed


async def test_embeddings_walk_a_chain_of_embedding_models_like_chat(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    a.set_default(Reply(503))
    gw = await gateway_factory(
        config(
            model("e1", route(a)),
            model("e2", route(b)),
            chains=[{"name": "vectors", "models": ["e1", "e2"]}],
            steering=QUIET,
            circuit={"failure_threshold": 50, "cooldown_seconds": 30},
            routing={"bench": {"failures": 50}},
        )
    )

    raw = await gw.openai().embeddings.with_raw_response.create(model="auto:vectors", input="hi")

    assert raw.parse().model == "e2" and raw.headers["x-routed-via"] == eid("e2", b)
    assert len(a.requests) == 1 and len(b.requests) == 1


async def test_a_steered_request_costs_one_bus_round_trip_on_the_happy_path(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    cfg = _catalogue(a, b, c, chains=[{"name": "duo", "models": ["c", "a"]}])
    cfg["models"].append(model("last", route(a), catalog={"enabled": False}))  # a sentinel
    gw = await gateway_factory(cfg)

    async with watch(gw, "llmgw.model.*.route") as plans:
        for name in ("auto", "auto:duo", "auto:smartest", "AUTO:cheap", "last"):
            await _served(gw.openai(), name)
        asked = [await plans.next(RouteRequest)]
        while asked[-1].model != "last":
            asked.append(await plans.next(RouteRequest))

    # One plan asked per request, of the model that served it, and nothing else on the way.
    assert [r.model for r in asked] == ["a", "c", "a", "b", "last"]
    assert len({r.request_id for r in asked}) == 5
