"""Chain and steering administration through the real server (``/admin/chains/<verb>``,
``/admin/steering/<verb>``, thin clients of the bus commands the SteeringActor and the
ChainActors answer): changes route the next request, refusals are 400s naming the field,
presets write priority only, a backfilling chain gains a reloaded model, and everything
survives a restart. On ``inproc://`` and on NATS."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import yaml

from schemas import AdminExecuted, subjects
from tests.e2e.conftest import CHAT, HI, assert_openai_error, config, model, route, watch

if TYPE_CHECKING:
    from pathlib import Path

    import httpx

    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import FakeUpstream, UpstreamFactory

pytestmark = pytest.mark.e2e

ADMIN = "adm-steering"
AUTH = {"authorization": f"Bearer {ADMIN}"}


def _config(a: FakeUpstream, b: FakeUpstream, c: FakeUpstream, **extra: Any) -> dict[str, Any]:
    """a smartest, b with the biggest free allowance, c the least capable."""
    return config(
        model("a", route(a), catalog={"tier": 3}),
        model("b", route(b), catalog={"tier": 2, "free_allowance": {"monthly_tokens": 10**9}}),
        model("c", route(c), catalog={"tier": 1}),
        admin_key=ADMIN,
        steering={"exploration": 0},
        routing={"affinity": {"enabled": False}},
        **extra,
    )


async def _admin(gw: RunningGateway, area: str, verb: str, **args: Any) -> httpx.Response:
    return await gw.http().post(f"/admin/{area}/{verb}", json=args, headers=AUTH)


async def _ok(gw: RunningGateway, area: str, verb: str, **args: Any) -> dict[str, Any]:
    resp = await _admin(gw, area, verb, **args)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()
    return result


async def _model(gw: RunningGateway, name: str) -> str:
    resp = await gw.http().post(CHAT, json={"model": name, "messages": HI})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["model"])


def _order(chain: dict[str, Any]) -> list[tuple[str, bool]]:
    return [(m["model"], m["enabled"]) for m in chain["models"]]


async def test_chain_verbs_route_the_next_request_and_are_audited(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    gw = await gateway_factory(_config(a, b, c))

    async with watch(gw, subjects.event("admin")) as audit:
        created = await _ok(gw, "chains", "create", name="Team", models=["b"])
        seen = [await _model(gw, "auto:team")]
        await _ok(gw, "chains", "set_models", name="team", models=["c", "b"])
        seen.append(await _model(gw, "auto:team"))
        moved = await _ok(gw, "chains", "move", name="team", model="b", position=1)
        seen.append(await _model(gw, "auto:team"))
        await _ok(gw, "chains", "set_enabled", name="team", model="b", enabled=False)
        seen.append(await _model(gw, "auto:team"))
        await _ok(gw, "chains", "set_enabled", name="team", model="b", enabled=True)
        before = await _model(gw, "auto")  # the built-in chain: a, the smartest
        await _ok(gw, "chains", "activate", name="team")
        await _ok(gw, "steering", "set_profile", profile="priority")
        after = await _model(gw, "auto")  # the active chain, as written
        refused = await _admin(gw, "chains", "delete", name="team")
        await _ok(gw, "chains", "activate", name=None)
        deleted = await _ok(gw, "chains", "delete", name="team")
        gone = await gw.http().post(CHAT, json={"model": "auto:team", "messages": HI})
        listed = await _ok(gw, "chains", "list")
        events = [
            await audit.next(AdminExecuted, lambda e: e.area in ("chains", "steering"))
            for _ in range(9)
        ]

    assert _order(created) == [("b", True)]
    assert _order(moved) == [("b", True), ("c", True)]
    assert seen == ["b", "c", "b", "c"]
    assert (before, after) == ("a", "b")
    assert_openai_error(refused, 400, "invalid_request")
    assert refused.json()["error"]["param"] == "name"
    assert deleted == {"deleted": "team"}
    assert "'team'" in assert_openai_error(gone, 400)["message"]
    assert listed == {"chains": [], "active_chain": None}
    assert [(e.area, e.verb, e.ok) for e in events] == [
        ("chains", "create", True),
        ("chains", "set_models", True),
        ("chains", "move", True),
        ("chains", "set_enabled", True),
        ("chains", "set_enabled", True),
        ("chains", "activate", True),
        ("steering", "set_profile", True),
        ("chains", "delete", False),
        ("chains", "activate", True),
    ]


@pytest.mark.parametrize(
    ("area", "verb", "args", "param"),
    [
        ("chains", "create", {"name": "fastest"}, "name"),
        ("chains", "create", {"name": "x y"}, "name"),
        ("chains", "create", {"name": "ok", "models": ["nope"]}, "models"),
        ("chains", "create", {"name": "ok", "models": "a"}, "models"),
        ("chains", "create", {"name": "ok", "backfill": "yes"}, "backfill"),
        ("chains", "set_models", {"name": "base", "models": ["a", "a"]}, "models"),
        ("chains", "move", {"name": "base", "model": "a", "position": 0}, "position"),
        ("chains", "move", {"name": "base", "model": "c", "position": 1}, "model"),
        ("chains", "set_enabled", {"name": "base", "model": "a", "enabled": 1}, "enabled"),
        ("chains", "preset", {"name": "base", "preset": "cleverest"}, "preset"),
        ("steering", "set_profile", {"profile": "custom", "weights": [0.5, 0.5, 0.5]}, "weights"),
        ("steering", "set_profile", {"profile": "clever"}, "profile"),
        ("steering", "set_guardrails", {"allowance_floor": 2}, "allowance_floor"),
        ("steering", "set_guardrails", {"colour": 1}, "colour"),
        ("steering", "set_exploration", {"exploration": -0.1}, "exploration"),
    ],
)
async def test_a_refused_change_is_a_400_naming_the_field_and_changes_nothing(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    area: str,
    verb: str,
    args: dict[str, Any],
    param: str,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    gw = await gateway_factory(_config(a, b, c, chains=[{"name": "base", "models": ["a"]}]))
    settings = await _ok(gw, "steering", "get")

    resp = await _admin(gw, area, verb, **args)

    assert assert_openai_error(resp, 400, "invalid_request")["param"] == param
    assert (await _ok(gw, "chains", "list"))["chains"] == [
        {
            "name": "base",
            "org": None,
            "backfill": False,
            "models": [{"model": "a", "enabled": True}],
        }
    ]
    assert await _ok(gw, "steering", "get") == settings


async def test_presets_write_priority_only(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    gw = await gateway_factory(
        _config(
            a, b, c, chains=[{"name": "mine", "models": ["c", {"model": "a", "enabled": False}]}]
        )
    )

    smartest = await _ok(gw, "chains", "preset", name="mine", preset="smartest")
    budget = await _ok(gw, "chains", "preset", name="mine", preset="biggest_budget")
    served = await _model(gw, "auto:mine")

    # b was not named: written in switched off; a keeps its off, c its on.
    assert _order(smartest) == [("a", False), ("b", False), ("c", True)]
    assert _order(budget)[0] == ("b", False)
    assert sorted(_order(budget)) == sorted(_order(smartest))
    assert served == "c"


async def test_chains_and_settings_survive_a_restart(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    cfg = _config(a, b, c, chains=[{"name": "declared", "models": ["a"]}])
    gw = await gateway_factory(cfg)
    await _ok(gw, "chains", "create", name="made", org="acme", models=["c", "b"])
    await _ok(gw, "chains", "set_backfill", name="made", backfill=True)
    await _ok(gw, "chains", "create", name="lead", models=["b", "a"])
    await _ok(gw, "chains", "activate", name="lead")
    await _ok(gw, "steering", "set_profile", profile="priority")
    await _ok(gw, "steering", "set_guardrails", rate_limit_penalty=0.25)
    await _ok(gw, "chains", "delete", name="declared")
    await gw.stop()

    again = await gateway_factory(cfg)
    chains = (await _ok(again, "chains", "list"))["chains"]
    settings = await _ok(again, "steering", "get")
    served = await _model(again, "auto")

    assert chains == [
        {
            "name": "lead",
            "org": None,
            "backfill": False,
            "models": [{"model": "b", "enabled": True}, {"model": "a", "enabled": True}],
        },
        {
            "name": "made",
            "org": "acme",
            "backfill": True,
            "models": [{"model": "c", "enabled": True}, {"model": "b", "enabled": True}],
        },
    ]
    assert settings["active_chain"] == "lead" and settings["profile"] == "priority"
    assert settings["guardrails"]["rate_limit_penalty"] == 0.25
    assert served == "b"


async def test_after_a_restart_a_chain_only_the_file_shaped_follows_the_file_an_edited_one_not(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    # The snapshot every chain saved at start won over the file for good: a chain edited in
    # the config file kept its old models after a restart, though no admin had touched it.
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    before = [{"name": "filed", "models": ["a"]}, {"name": "edited", "models": ["a"]}]
    gw = await gateway_factory(_config(a, b, c, chains=before))
    await _ok(gw, "chains", "set_models", name="edited", models=["c"])
    await gw.stop()

    after = [{"name": "filed", "models": ["b", "c"]}, {"name": "edited", "models": ["b"]}]
    again = await gateway_factory(_config(a, b, c, chains=after))
    chains = {ch["name"]: _order(ch) for ch in (await _ok(again, "chains", "list"))["chains"]}
    served = [await _model(again, "auto:filed"), await _model(again, "auto:edited")]

    assert chains == {"filed": [("b", True), ("c", True)], "edited": [("c", True)]}
    assert served == ["b", "c"]


async def test_a_reload_changes_a_chain_only_the_file_shaped(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    path = tmp_path / "gw.yaml"
    gw = await gateway_factory(
        _config(a, b, c, chains=[{"name": "filed", "models": ["a"]}]), config_path=path
    )
    path.write_text(
        yaml.safe_dump(_config(a, b, c, chains=[{"name": "filed", "models": ["c", "a"]}]))
    )

    reload = await gw.http().post("/admin/config/reload", headers=AUTH)
    chain = await _ok(gw, "chains", "get", name="filed")
    served = await _model(gw, "auto:filed")

    assert reload.status_code == 200, reload.text
    assert (_order(chain), served) == ([("c", True), ("a", True)], "c")


async def test_a_backfilling_chain_gains_a_reloaded_model_and_a_plain_one_does_not(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    tmp_path: Path,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    chains = [
        {"name": "grow", "backfill": True, "models": ["a"]},
        {"name": "keep", "models": ["a"]},
    ]
    cfg = _config(a, b, c, chains=chains)
    path = tmp_path / "gw.yaml"
    gw = await gateway_factory(cfg, config_path=path)
    grown = {
        **cfg,
        "models": [
            *cfg["models"],
            model("n", route(a), catalog={"enabled": False}),
            model("m", route(b)),
        ],
    }
    path.write_text(__import__("yaml").safe_dump(grown))

    reload = await gw.http().post("/admin/config/reload", headers=AUTH)
    grow = await _ok(gw, "chains", "get", name="grow")
    keep = await _ok(gw, "chains", "get", name="keep")

    assert reload.status_code == 200, reload.text
    assert _order(grow) == [("a", True), ("n", False), ("m", True)]
    assert _order(keep) == [("a", True)]
