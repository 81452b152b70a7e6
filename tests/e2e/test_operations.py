"""Operating the gateway through the real server: request log, decision events, /metrics,
/events (SSE), the HTTP admin API and config reload. Runs on ``inproc://`` and on NATS."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.adapters.sse import SSEParser
from gateway.process.config import ConfigError, load_config
from schemas import ChainModelsDropped, RouteDecided, subjects
from tests.e2e.conftest import (
    CHAT,
    WAIT,
    Watch,
    chat,
    circuit_events,
    config,
    eid,
    gateway_bus,
    model,
    route,
    watch,
)
from tests.fixtures.upstream import FakeUpstream, Reply, UpstreamFactory

if TYPE_CHECKING:
    from pathlib import Path

    import httpx

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

ADMIN = "adm-test-key"
AUTH = {"authorization": f"Bearer {ADMIN}"}


async def admin(gw: RunningGateway, area: str, verb: str, **args: Any) -> httpx.Response:
    return await gw.http().post(f"/admin/{area}/{verb}", json=args, headers=AUTH)


async def fallback_gateway(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> tuple[RunningGateway, FakeUpstream, FakeUpstream]:
    """Model ``m``: ``a`` (answers 500) is all but always the primary, ``b`` serves; ``a``'s
    circuit opens after 2 failures and stays open."""
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    a.set_default(Reply(500))
    gw = await gateway_factory(
        config(
            model("m", route(a, 1e6), route(b, 1e-6)),
            circuit={"failure_threshold": 2, "cooldown_seconds": 300},
            admin_key=ADMIN,
        )
    )
    return gw, a, b


async def test_fallback_request_is_logged_as_two_attempt_rows_and_one_request_row(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    gw, a, b = await fallback_gateway(gateway_factory, fake_upstreams)
    async with watch(gw, subjects.event("decision")) as decisions:
        resp = await gw.http().post(CHAT, json=chat("m"))
        decided = await decisions.next(RouteDecided)
    rid = resp.headers["x-request-id"]
    query = await admin(gw, "log", "query", request_id=rid)

    assert resp.status_code == 200, resp.text
    rows = query.json()["rows"]
    assert [(r["kind"], r["endpoint"], r["attempt"], r["fallback"], r["status"]) for r in rows] == [
        ("attempt", eid("m", a), 1, False, 500),
        ("attempt", eid("m", b), 2, True, 200),
        ("request", eid("m", b), 2, True, 200),
    ]
    req = rows[2]
    assert (req["requested_model"], req["model"], req["surface"], req["outcome"]) == (
        "m",
        "m",
        "chat",
        "success",
    )
    assert req["completion_tokens"] == b.completion_tokens and not req["stream"]
    assert rows[0]["outcome"] == "failure" and rows[0]["error_kind"]
    assert req["caller_id"].startswith("c-") and "127.0.0.1" not in str(rows)
    assert (decided.primary, decided.served, decided.fallback, decided.attempts) == (
        eid("m", a),
        eid("m", b),
        True,
        2,
    )
    assert decided.request_id == rid and decided.reason


async def test_streamed_request_is_logged_with_its_time_to_first_token(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    gw = await gateway_factory(config(model("m", route(fake_upstream)), admin_key=ADMIN))
    async with gw.http().stream("POST", CHAT, json=chat("m", stream=True)) as resp:
        body = await resp.aread()
        rid = resp.headers["x-request-id"]
    rows = (await admin(gw, "log", "query", request_id=rid, kind="request")).json()["rows"]

    assert resp.status_code == 200 and b"[DONE]" in body
    [row] = rows
    assert row["stream"] and row["status"] == 200 and row["outcome"] == "success"
    assert 0 < row["ttft_ms"] <= row["latency_ms"]


async def test_metrics_are_prometheus_text_with_requests_latency_attempts_and_circuits(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    gw, a, b = await fallback_gateway(gateway_factory, fake_upstreams)
    client = gw.http()
    async with circuit_events(gw) as circuits:
        for _ in range(2):
            assert (await client.post(CHAT, json=chat("m"))).status_code == 200
        # The EndpointActor publishes its new state before this event: the views have it.
        await circuits.circuit("open", eid("m", a))
    assert (await client.post(CHAT, json=chat("m"))).status_code == 200
    assert (await client.post(CHAT, json=chat("nope"))).status_code == 404
    resp = await client.get("/metrics")

    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(resp.text)
        for s in f.samples
    }
    ea, eb = eid("m", a), eid("m", b)
    on_b = (("endpoint", eb), ("model", "m"), ("surface", "chat"))
    assert samples[("llmgw_requests_total", on_b)] == 3
    assert samples[("llmgw_request_duration_seconds_count", on_b)] == 3
    # Two fall back from a; a's circuit is then open, so the third goes straight to b.
    assert samples[("llmgw_fallbacks_total", (("endpoint", eb), ("model", "m")))] == 2
    assert (
        samples[
            ("llmgw_attempts_total", (("endpoint", ea), ("model", "m"), ("outcome", "failure")))
        ]
        == 2
    )
    assert (
        samples[
            (
                "llmgw_request_errors_total",
                (
                    ("endpoint", "-"),
                    ("kind", "route_not_found"),
                    ("model", "-"),
                    ("surface", "chat"),
                ),
            )
        ]
        == 1
    )
    assert samples[("llmgw_circuit_state", (("endpoint", ea), ("model", "m")))] == 2  # open
    assert samples[("llmgw_endpoint_availability", (("endpoint", eb), ("model", "m")))] == 1
    assert samples[("llmgw_bus_rtt_seconds_count", (("op", "route"),))] == 4 - 1
    assert ("llmgw_log_rows_dropped_total", (("cause", "queue_full"),)) in samples
    assert samples[("llmgw_circuit_transitions_total", (("endpoint", ea), ("to", "open")))] == 1


async def test_events_stream_sends_a_circuit_opening_to_admins_only(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    fake_upstream.set_default(Reply(500))
    gw = await gateway_factory(config(model("m", route(fake_upstream)), admin_key=ADMIN))
    client = gw.http()
    refused = await client.get("/events")
    parser = SSEParser()
    frames: list[tuple[str | None, bytes]] = []
    async with client.stream("GET", "/events", params={"kind": "circuit"}, headers=AUTH) as events:
        chunks = events.aiter_bytes()
        assert b"subscribed" in await anext(chunks)  # the subscription is in place
        for _ in range(2):
            await client.post(CHAT, json=chat("m"))
        async with asyncio.timeout(WAIT):
            while not frames:
                frames += parser.feed(await anext(chunks))

    assert refused.status_code == 401
    kind, data = frames[0]
    event = json.loads(data)
    assert kind == "circuit"
    assert (event["kind"], event["type"], event["endpoint"], event["new"]) == (
        "circuit",
        "CircuitTransition",
        eid("m", fake_upstream),
        "open",
    )


def _file_config(tmp_path: Path, *models: dict[str, Any]) -> dict[str, Any]:
    return config(*models, admin_key=ADMIN, database={"path": str(tmp_path / "gw.sqlite3")})


async def test_reload_adding_a_model_mid_traffic_fails_no_request(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    path = tmp_path / "gw.yaml"
    echo = {"kind": "echo"}
    gw = await gateway_factory(
        _file_config(tmp_path, model("a", route(fake_upstream))), config_path=path
    )
    client = gw.http()
    statuses: list[int] = []
    stop = asyncio.Event()

    async def traffic() -> None:
        while not stop.is_set():
            statuses.append((await client.post(CHAT, json=chat("a"))).status_code)

    workers = [asyncio.create_task(traffic()) for _ in range(4)]
    await fake_upstream.wait_for_requests(8)
    path.write_text(
        yaml.safe_dump(_file_config(tmp_path, model("a", route(fake_upstream)), model("b", echo)))
    )
    reloaded = await admin(gw, "config", "reload")
    new_model = await client.post(CHAT, json=chat("b"))
    served = len(fake_upstream.requests)
    await fake_upstream.wait_for_requests(served + 8)  # traffic goes on after the swap
    stop.set()
    await asyncio.gather(*workers)

    assert reloaded.status_code == 200, reloaded.text
    assert (reloaded.json()["added"], reloaded.json()["removed"]) == (["b"], [])
    assert new_model.status_code == 200, new_model.text
    assert len(statuses) >= 16 and set(statuses) == {200}


async def test_reload_of_a_broken_file_is_refused_whole_with_startups_message(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    path = tmp_path / "gw.yaml"
    gw = await gateway_factory(
        _file_config(tmp_path, model("a", route(fake_upstream))), config_path=path
    )
    before = (await admin(gw, "config", "show")).json()
    broken = _file_config(
        tmp_path, model("a", route(fake_upstream, weight=-1)), model("b", {"kind": "echo"})
    )
    path.write_text(yaml.safe_dump(broken))
    with pytest.raises(ConfigError) as startup:
        load_config(path)
    refused = await admin(gw, "config", "reload")
    after = (await admin(gw, "config", "show")).json()
    still = await gw.http().post(CHAT, json=chat("a"))
    unknown = await gw.http().post(CHAT, json=chat("b"))

    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == str(startup.value)
    assert "models[0].route[0].weight" in str(startup.value)
    assert after == before and after["models"] == ["a"]
    assert still.status_code == 200 and unknown.status_code == 404


async def test_reload_with_a_route_key_variable_now_empty_is_refused_naming_it(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLMGW_E2E_ROUTE_KEY", "sk-upstream-secret")
    path = tmp_path / "gw.yaml"
    keyed = {**route(fake_upstream), "api_key": "${LLMGW_E2E_ROUTE_KEY}"}
    gw = await gateway_factory(_file_config(tmp_path, model("a", keyed)), config_path=path)
    monkeypatch.setenv("LLMGW_E2E_ROUTE_KEY", "")
    refused = await admin(gw, "config", "reload")
    still = await gw.http().post(CHAT, json=chat("a"))

    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        f"{path}: models[0].route[0].api_key: environment variable LLMGW_E2E_ROUTE_KEY "
        "is set but empty"
    )
    assert still.status_code == 200, still.text
    sent = fake_upstream.requests[-1].headers.get("authorization")
    assert sent == "Bearer sk-upstream-secret"  # the running config keeps its key


async def test_reload_removing_a_model_an_admin_chain_names_is_refused_whole(
    gateway_factory: GatewayFactory,
    tmp_path: Path,
) -> None:
    """The reload was applied and the chain kept naming the removed model; startup refuses
    a config whose chain names a model it lacks."""
    path = tmp_path / "gw.yaml"
    echo = {"kind": "echo"}
    gw = await gateway_factory(
        _file_config(tmp_path, model("a", echo), model("b", echo)), config_path=path
    )
    made = await admin(gw, "chains", "create", name="team", models=["a", "b"])
    before = (await admin(gw, "config", "show")).json()
    path.write_text(yaml.safe_dump(_file_config(tmp_path, model("a", echo))))

    refused = await admin(gw, "config", "reload")
    after = (await admin(gw, "config", "show")).json()
    chain = (await admin(gw, "chains", "get", name="team")).json()
    still = await gw.http().post(CHAT, json=chat("b"))
    await admin(gw, "chains", "set_models", name="team", models=["a"])
    applied = await admin(gw, "config", "reload")

    assert made.status_code == 200, made.text
    assert refused.status_code == 400
    assert refused.json()["error"]["message"].startswith(
        f"{path}: chain 'team' names 'b', which is no model id of this config; "
        "the running config stays"
    )
    assert after == before and after["models"] == ["a", "b"]
    assert [e["model"] for e in chain["models"]] == ["a", "b"]
    assert still.status_code == 200, still.text
    assert applied.status_code == 200 and applied.json()["removed"] == ["b"], applied.text


UNPRICED = "have no pricing: and are billed $0"


async def test_a_start_on_a_file_lacking_a_model_an_admin_chain_names_drops_it_and_says_so(
    gateway_factory: GatewayFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The gateway started with the chain naming the model nothing served, and said nothing
    (a reload to that file is refused; startup refuses a file whose chains: name it)."""
    path = tmp_path / "gw.yaml"
    echo = {"kind": "echo"}
    first = await gateway_factory(
        _file_config(tmp_path, model("a", echo), model("b", echo)), config_path=path
    )
    made = await admin(first, "chains", "create", name="team", models=["a", "b"])
    await first.stop()
    since = time.time()
    gw = await gateway_factory(_file_config(tmp_path, model("a", echo)), config_path=path)
    chain = (await admin(gw, "chains", "get", name="team")).json()
    async with gateway_bus(gw).replay(
        subjects.event("chains"), stream=subjects.EVENTS_STREAM, since=since
    ) as kept:
        dropped = await Watch(kept).next(ChainModelsDropped)
    steered = await gw.http().post(CHAT, json=chat("auto:team"))

    assert made.status_code == 200, made.text
    assert [e["model"] for e in chain["models"]] == ["a"]
    assert (dropped.chain, dropped.models, dropped.before) == ("team", ("b",), ("a", "b"))
    assert steered.status_code == 200, steered.text
    warned = [r.getMessage() for r in caplog.records if r.name == "actors.chain"]
    assert warned == [
        "chain 'team', made or edited by an admin command, names 'b', which is no model id of "
        "this config: taken out of the chain (it was a, b; to put it back, add it to models: "
        "again, reload, then llmgw admin chains set_models)"
    ]


async def test_reload_applies_the_files_steering_settings_until_an_admin_changes_them(
    gateway_factory: GatewayFactory,
    tmp_path: Path,
) -> None:
    """The steering snapshot saved at every start won over the file for good: a reload (or a
    restart) changing steering: was answered 200 and changed nothing, though no admin
    command had touched the settings."""
    path = tmp_path / "gw.yaml"
    echo = {"kind": "echo"}
    body = _file_config(tmp_path, model("a", echo), model("b", echo))

    def steering(**settings: Any) -> None:
        path.write_text(yaml.safe_dump({**body, "steering": settings}))

    gw = await gateway_factory(body, config_path=path)
    steering(profile="fastest", exploration=0.2)
    followed = await admin(gw, "config", "reload")
    after_file = (await admin(gw, "steering", "get")).json()
    await admin(gw, "steering", "set_profile", profile="smartest")
    steering(profile="reliable", exploration=0.3)
    kept = await admin(gw, "config", "reload")
    after_admin = (await admin(gw, "steering", "get")).json()

    assert followed.status_code == 200, followed.text
    assert (after_file["profile"], after_file["exploration"]) == ("fastest", 0.2)
    assert kept.status_code == 200, kept.text
    assert (after_admin["profile"], after_admin["exploration"]) == ("smartest", 0.2)


async def test_reload_dropping_the_chain_an_admin_activated_is_refused_and_a_start_says_so(
    gateway_factory: GatewayFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Either left auto on the built-in chain, silently, where chains delete refuses to
    delete the active chain."""
    path = tmp_path / "gw.yaml"
    echo = {"kind": "echo"}
    body = _file_config(tmp_path, model("a", echo), model("b", echo))
    team = {**body, "chains": [{"name": "team", "models": ["b"]}]}
    first = await gateway_factory(team, config_path=path)
    activated = await admin(first, "chains", "activate", name="team")
    path.write_text(yaml.safe_dump(body))
    refused = await admin(first, "config", "reload")
    steered = (await first.http().post(CHAT, json=chat("auto"))).json()["model"]
    await first.stop()
    gw = await gateway_factory(body, config_path=path)
    settings = (await admin(gw, "steering", "get")).json()

    assert activated.status_code == 200, activated.text
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["message"] == (
        f"{path}: the active chain 'team' is no chain of this config; the running config stays "
        "(an admin command activated it, and auto routes over it: activate another first, "
        "llmgw admin chains activate --arg name=CHAIN, or none, with no name)"
    )
    assert steered == "b"  # still over chain team
    assert settings["active_chain"] is None
    warned = [r.getMessage() for r in caplog.records if r.name == "actors.state.steering_settings"]
    assert warned == [
        "the active chain 'team' is no chain of this config (an admin command activated it): "
        "auto routes over the built-in chain until one is activated (llmgw admin chains "
        "activate --arg name=CHAIN)"
    ]


async def test_reload_warns_of_unpriced_routes_once_applied_and_never_when_refused(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Startup names the routes with no pricing:; a reload named those of any file it read,
    even one it then refused (the running config had none)."""
    path = tmp_path / "gw.yaml"
    echo = {"kind": "echo"}
    gw = await gateway_factory(
        _file_config(tmp_path, model("a", echo), model("c", echo)), config_path=path
    )
    await admin(gw, "chains", "create", name="team", models=["a", "c"])
    path.write_text(
        yaml.safe_dump(_file_config(tmp_path, model("a", echo), model("b", route(fake_upstream))))
    )
    caplog.set_level(logging.WARNING)
    caplog.clear()

    refused = await admin(gw, "config", "reload")  # the chain still names c
    warned_when_refused = [r for r in caplog.records if UNPRICED in r.getMessage()]
    await admin(gw, "chains", "set_models", name="team", models=["a"])
    applied = await admin(gw, "config", "reload")
    warned = [r.getMessage() for r in caplog.records if UNPRICED in r.getMessage()]

    assert refused.status_code == 400 and applied.status_code == 200, applied.text
    assert warned_when_refused == []
    assert len(warned) == 1 and warned[0].endswith(f": {eid('b', fake_upstream)}"), warned


async def test_reload_applies_a_rotated_admin_key_and_a_new_auth_mode(
    gateway_factory: GatewayFactory,
    tmp_path: Path,
) -> None:
    path = tmp_path / "gw.yaml"
    echo = model("a", {"kind": "echo"})
    gw = await gateway_factory(_file_config(tmp_path, echo), config_path=path)
    open_before = await gw.http().post(CHAT, json=chat("a"))
    rotated = "adm-rotated-key"
    path.write_text(
        yaml.safe_dump({**_file_config(tmp_path, echo), "admin_key": rotated, "auth": "required"})
    )
    reloaded = await admin(gw, "config", "reload")
    old_key = await gw.http().get("/admin/config/show", headers=AUTH)
    new_key = await gw.http().get(
        "/admin/config/show", headers={"authorization": f"Bearer {rotated}"}
    )
    open_after = await gw.http().post(CHAT, json=chat("a"))

    assert open_before.status_code == 200 and reloaded.status_code == 200, reloaded.text
    assert old_key.status_code == 401 and new_key.status_code == 200, new_key.text
    assert open_after.status_code == 401  # auth: required now, and no key was sent


async def test_admin_api_needs_the_admin_key_and_names_unknown_areas(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await gateway_factory(config(model("a", {"kind": "echo"}), admin_key=ADMIN))
    client = gw.http()
    anonymous = await client.post("/admin/config/show")
    unknown_area = await admin(gw, "nope", "show")
    unknown_verb = await admin(gw, "config", "explode")
    stats = await client.get("/admin/log/stats", headers=AUTH)

    assert anonymous.status_code == 401
    assert unknown_area.status_code == 404 and "nope" in unknown_area.json()["error"]["message"]
    assert unknown_verb.status_code == 400 and "reload" in unknown_verb.json()["error"]["message"]
    assert stats.status_code == 200 and stats.json()["dropped"] == 0
