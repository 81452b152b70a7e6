"""The SteeringActor's answer to a config reload's ``ChainsCheck``: which chains, were it
started on the new config, would name a model that config lacks. Only a chain an admin
command made or edited can, and only one that would run then: what the running ChainActors
hold, or (a configured chain the file lists again) what its snapshot keeps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from actors import ChildSpec, Supervisor
from actors.steering import SteeringActor
from actors.stores.db import open_db
from actors.stores.snapshots import SNAPSHOTS, SnapshotStore
from schemas import (
    AdminCommand,
    AdminReply,
    ChainEntry,
    ChainModels,
    ChainsCheck,
    ChainsChecked,
    raise_for_reply,
    subjects,
)
from schemas.catalog import ChainConfig, SteeringConfig
from schemas.config import ModelConfig
from tests.unit.actors import WAIT

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from bus import InProcessBus

MODELS = tuple(ModelConfig.model_validate({"id": m}) for m in ("a", "b", "c"))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SnapshotStore]:
    db = await open_db(str(tmp_path / "snap.db"), [SNAPSHOTS])
    yield SnapshotStore(db)
    await db.close()


async def _running(bus: InProcessBus, store: SnapshotStore, *chains: ChainConfig) -> Supervisor:
    actor = SteeringActor(MODELS, chains, SteeringConfig(), snapshots=store)
    root = Supervisor("test", children=[ChildSpec("steering", lambda: actor)])
    await root.start(bus)
    return root


async def _admin(bus: InProcessBus, verb: str, **args: Any) -> None:
    reply = await bus.request(
        subjects.admin("chains", verb), AdminCommand(args=args), reply_type=AdminReply, timeout=WAIT
    )
    raise_for_reply(reply)


async def _check(bus: InProcessBus, models: tuple[str, ...], *chains: str) -> tuple[Any, ...]:
    reply = await bus.request(
        subjects.STEERING_CHECK,
        ChainsCheck(models=models, chains=chains),
        reply_type=ChainsChecked,
        timeout=WAIT,
    )
    return raise_for_reply(reply).gone


def _chain(name: str, *models: str) -> ChainConfig:
    return ChainConfig(name=name, models=models)


async def test_only_a_chain_an_admin_shaped_that_would_run_names_a_model_the_config_lacks(
    bus: InProcessBus, store: SnapshotStore
) -> None:
    root = await _running(
        bus, store, _chain("filed", "a", "b"), _chain("edited", "a"), _chain("gone", "b")
    )
    await _admin(bus, "create", name="team", models=["a", {"model": "b", "enabled": False}])
    await _admin(bus, "set_models", name="edited", models=["b", "c"])
    await _admin(bus, "set_models", name="gone", models=["b"])
    await _admin(bus, "create", name="dropped", models=["b"])
    await _admin(bus, "delete", name="dropped")

    kept_c = await _check(bus, ("a", "c"), "filed", "edited")  # the file drops chain gone
    kept_all = await _check(bus, ("a", "b", "c"), "filed", "edited", "gone")
    await root.stop()

    assert kept_c == (
        ChainModels(chain="edited", models=("b",), kept=(ChainEntry(model="c"),)),
        ChainModels(chain="team", models=("b",), kept=(ChainEntry(model="a"),)),
    )
    assert kept_all == ()


async def test_a_configured_chain_the_file_lists_again_is_checked_as_its_snapshot_keeps_it(
    bus: InProcessBus, store: SnapshotStore
) -> None:
    """Not running now, it would start from its snapshot: the admin's edit wins over the
    file, so the model the admin left in it counts."""
    root = await _running(bus, store, _chain("back", "a"))
    await _admin(bus, "set_models", name="back", models=["a", "b"])
    await root.stop()
    root = await _running(bus, store)  # a file without chain back

    back = await _check(bus, ("a",), "back")
    away = await _check(bus, ("a",))
    await root.stop()

    assert back == (ChainModels(chain="back", models=("b",), kept=(ChainEntry(model="a"),)),)
    assert away == ()


async def test_the_active_chain_an_admin_set_counts_when_the_new_config_drops_it(
    bus: InProcessBus, store: SnapshotStore
) -> None:
    """The file's own active chain is checked against its chains: as it loads; the one an
    admin activated outlives the reload with the settings, and auto would lose it."""
    steering = SteeringConfig(active_chain="filed")
    actor = SteeringActor(MODELS, (_chain("filed", "a"), _chain("other", "b")), steering)
    root = Supervisor("test", children=[ChildSpec("steering", lambda: actor)])
    await root.start(bus)
    files = await _answer(bus, ("a", "b"), "other")
    await _admin(bus, "activate", name="other")
    dropped = await _answer(bus, ("a", "b"), "filed")
    kept = await _answer(bus, ("a", "b"), "other")
    await root.stop()

    assert files.active == ""  # the new file's settings say which chain is active
    assert dropped.active == "other"
    assert kept.active == "" and kept.gone == ()


async def _answer(bus: InProcessBus, models: tuple[str, ...], *chains: str) -> ChainsChecked:
    reply = await bus.request(
        subjects.STEERING_CHECK,
        ChainsCheck(models=models, chains=chains),
        reply_type=ChainsChecked,
        timeout=WAIT,
    )
    assert isinstance(reply, ChainsChecked), reply
    return reply
