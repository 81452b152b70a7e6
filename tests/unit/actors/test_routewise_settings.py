"""RouteWise settings: the precedence (model override > router_params > deployment fallback >
default), and the RouteWiseSettingsActor's admin verbs on the in-process bus (aliases,
refusals, the ModelActor applying a change before the answer, the snapshot)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from actors import ChildSpec, ModelActor, Supervisor
from actors.routewise_settings import RouteWiseSettingsActor
from actors.stores.db import open_db
from actors.stores.snapshots import SNAPSHOTS, SnapshotStore
from actors.strategies.routewise import settings as rw
from gateway.admin.http import admin_request
from schemas import ErrorCode, GatewayError, RouteWiseSettings
from schemas.config import ModelConfig, RoutingConfig
from tests.unit.actors import WAIT, FakeClock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from bus import InProcessBus

MODEL = ModelConfig.model_validate(
    {
        "id": "org/m",
        "aliases": ["m-alias"],
        "router": "routewise",
        "router_params": {"budget_alpha": 0.3, "latency_slo_sec": 2.0},
        "route": [{"kind": "echo"}, {"kind": "echo"}],
    }
)
FIXED = ModelConfig.model_validate({"id": "plain", "route": [{"kind": "echo"}]})


def test_precedence_is_override_then_router_params_then_fallback_then_default() -> None:
    settings = RouteWiseSettings(
        models={"org/m": {"budget_alpha": 0.9}},
        fallback={"budget_alpha": 0.1, "latency_slo_sec": 9.0, "envelope_min_samples": 4},
    )
    view = rw.view(MODEL, settings)["settings"]
    assert view["budget_alpha"] == {"value": 0.9, "source": "model_override"}
    assert view["latency_slo_sec"] == {"value": 2.0, "source": "router_params"}
    assert view["envelope_min_samples"] == {"value": 4, "source": "deployment_fallback"}
    assert view["latency_window_sec"] == {"value": 900.0, "source": "default"}
    assert rw.effective(MODEL, RouteWiseSettings()).budget_alpha == 0.3


async def _admin(bus: InProcessBus, verb: str, **args: Any) -> dict[str, Any]:
    return await admin_request(bus, "routewise", verb, args, by="test", timeout=WAIT)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SnapshotStore]:
    db = await open_db(str(tmp_path / "snap.db"), [SNAPSHOTS])
    yield SnapshotStore(db)
    await db.close()


async def _start(bus: InProcessBus, store: SnapshotStore, clock: FakeClock) -> Supervisor:
    root = Supervisor(
        "test",
        children=[
            ChildSpec(
                "rw",
                lambda: RouteWiseSettingsActor(
                    (MODEL, FIXED), "fixed", snapshots=store, clock=clock
                ),
            ),
            ChildSpec("model", lambda: ModelActor(MODEL, RoutingConfig(), clock=clock)),
        ],
    )
    await root.start(bus)
    return root


async def test_set_through_an_alias_is_applied_by_the_model_before_the_answer(
    bus: InProcessBus,
    store: SnapshotStore,
    clock: FakeClock,
) -> None:
    root = await _start(bus, store, clock)
    model = root.child("model")
    assert isinstance(model, ModelActor)
    answer = await _admin(
        bus, "set_model_setting", model_id="m-alias", key="budget_alpha", value=1.0
    )
    applied = model._strategy.params.budget_alpha  # type: ignore[attr-defined]
    await root.stop()

    assert answer["model_id"] == "org/m"
    assert answer["settings"]["budget_alpha"] == {"value": 1.0, "source": "model_override"}
    assert applied == 1.0


async def test_settings_survive_a_restart_and_delete_restores_the_inherited_value(
    bus: InProcessBus,
    store: SnapshotStore,
    clock: FakeClock,
) -> None:
    root = await _start(bus, store, clock)
    await _admin(bus, "set_model_setting", model_id="org/m", key="budget_alpha", value=0.8)
    await _admin(bus, "set_settings", settings={"latency_unprofiled_ttft_ms": 1234.0})
    await root.stop()

    root = await _start(bus, store, clock)
    model = root.child("model")
    assert isinstance(model, ModelActor)
    params = model._strategy.params  # type: ignore[attr-defined]
    kept = (params.budget_alpha, params.latency_unprofiled_ttft_ms)
    after = await _admin(bus, "unset_model_setting", model_id="org/m", key="budget_alpha")
    fallback = await _admin(bus, "settings")
    await root.stop()

    assert kept == (0.8, 1234.0)
    assert after["settings"]["budget_alpha"] == {"value": 0.3, "source": "router_params"}
    assert fallback["fallback"] == {"latency_unprofiled_ttft_ms": 1234.0}


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (
            {"model_id": "nope", "key": "budget_alpha", "value": 1},
            ErrorCode.ROUTE_NOT_FOUND,
            "nope",
        ),
        (
            {"model_id": "plain", "key": "budget_alpha", "value": 1},
            ErrorCode.INVALID_REQUEST,
            "does not use router: routewise",
        ),
        (
            {"model_id": "org/m", "key": "quota_limit", "value": 1},
            ErrorCode.INVALID_REQUEST,
            "unknown RouteWise setting 'quota_limit'",
        ),
        (
            {"model_id": "org/m", "key": "budget_alpha", "value": 7},
            ErrorCode.INVALID_REQUEST,
            "budget_alpha",
        ),
    ],
)
async def test_bad_settings_are_refused_with_the_reason(
    bus: InProcessBus,
    store: SnapshotStore,
    clock: FakeClock,
    args: dict[str, Any],
    code: ErrorCode,
    words: str,
) -> None:
    root = await _start(bus, store, clock)
    with pytest.raises(GatewayError) as exc:
        await _admin(bus, "set_model_setting", **args)
    await root.stop()
    assert exc.value.code == code and words in exc.value.message
