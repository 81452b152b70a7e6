"""A ChainActor's snapshot against the config file: a chain an admin command edited keeps its
snapshot (but a model its config lacks, dropped loudly), one only the file shaped follows the
file (keeping what backfill added while the catalogue has it), and a snapshot from before this
was recorded counts as the admin's."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import pytest

from actors import ChildSpec, Supervisor
from actors.chain import Catalogue, ChainActor, snapshot_name
from actors.stores.db import open_db
from actors.stores.snapshots import SNAPSHOTS, SnapshotStore
from schemas import ChainEdit, ChainEntry, ChainModelsDropped, ChainState, subjects
from tests.unit.actors import WAIT, next_event

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from bus import InProcessBus

CATALOGUE: Catalogue = (("a", True), ("b", True), ("c", True))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SnapshotStore]:
    db = await open_db(str(tmp_path / "snap.db"), [SNAPSHOTS])
    yield SnapshotStore(db)
    await db.close()


def _chain(*models: str, backfill: bool = False) -> ChainState:
    return ChainState(
        name="k", backfill=backfill, models=tuple(ChainEntry(model=m) for m in models)
    )


async def _run(
    bus: InProcessBus,
    store: SnapshotStore,
    file: ChainState,
    catalogue: Catalogue = CATALOGUE,
    edit: ChainEdit | None = None,
    known: tuple[str, ...] | None = None,
) -> tuple[str, ...]:
    """Start the chain from ``file`` (and its snapshot) on a config of ``catalogue`` (and the
    unpublished ``known``), apply ``edit``, stop; its models."""
    root = Supervisor(
        "test",
        children=[
            ChildSpec("k", lambda: ChainActor(file, catalogue, snapshots=store, known=known))
        ],
    )
    await root.start(bus)
    if edit is not None:
        await bus.request(subjects.chain_edit("k"), edit, reply_type=ChainState, timeout=WAIT)
    chain = root.child("k")
    assert isinstance(chain, ChainActor)
    models = tuple(e.model for e in chain.state.models)
    await root.stop()
    return models


async def test_a_chain_only_the_file_shaped_follows_the_file(
    bus: InProcessBus, store: SnapshotStore
) -> None:
    first = await _run(bus, store, _chain("a"))
    again = await _run(bus, store, _chain("a"))
    changed = await _run(bus, store, _chain("b", "c"))

    assert (first, again, changed) == (("a",), ("a",), ("b", "c"))


async def test_a_chain_an_admin_edited_keeps_its_snapshot_over_the_file(
    bus: InProcessBus, store: SnapshotStore
) -> None:
    edited = await _run(
        bus, store, _chain("a"), edit=ChainEdit(verb="set_models", models=(ChainEntry(model="c"),))
    )
    after = await _run(bus, store, _chain("b"))

    assert (edited, after) == (("c",), ("c",))


async def test_a_backfilling_chain_the_file_changes_keeps_what_backfill_added(
    bus: InProcessBus, store: SnapshotStore
) -> None:
    await _run(bus, store, _chain("a", backfill=True), catalogue=(("a", True),))
    grown = await _run(bus, store, _chain("a", backfill=True), catalogue=CATALOGUE)
    changed = await _run(bus, store, _chain("c", "a", backfill=True), catalogue=CATALOGUE)

    assert grown == ("a", "b", "c")  # b and c came by backfill
    assert changed == ("c", "a", "b")  # the file's order, then b, which only backfill named


async def test_a_backfilling_chain_the_file_shaped_drops_what_backfill_added_once_gone(
    bus: InProcessBus, store: SnapshotStore
) -> None:
    """A reload that removed b kept it in the chain (and now refuses such a reload): backfill
    brought it in with the catalogue, and it goes out with it."""
    await _run(bus, store, _chain("a", backfill=True), catalogue=(("a", True),))
    grown = await _run(bus, store, _chain("a", backfill=True), catalogue=CATALOGUE)
    shrunk = await _run(bus, store, _chain("a", backfill=True), catalogue=(("a", True),))
    edited = await _run(
        bus,
        store,
        _chain("a", backfill=True),
        catalogue=CATALOGUE,
        edit=ChainEdit(verb="move", model="c", position=1),
    )
    restarted = await _run(bus, store, _chain("a", backfill=True), catalogue=(("a", True),))

    assert grown == ("a", "b", "c") and shrunk == ("a",)
    assert edited == ("c", "a", "b")
    # The admin's chain: a reload leaving it so is refused; a start drops them, loudly.
    assert restarted == ("a",)


async def test_an_admins_chain_started_on_a_config_lacking_its_models_drops_them_loudly(
    bus: InProcessBus, store: SnapshotStore, caplog: pytest.LogCaptureFixture
) -> None:
    """It started naming them, silently: auto:<chain> and chains get named a model nothing
    served. A model the config keeps unpublished is still one of its models."""
    await _run(
        bus, store, _chain("a"), edit=ChainEdit(verb="set_models", models=_entries("a", "b", "c"))
    )
    async with bus.subscribe(subjects.event("chains")) as events:
        started = await _run(bus, store, _chain("a"), catalogue=(("a", True),), known=("a", "c"))
        dropped = await next_event(events, ChainModelsDropped)
    again = await _run(bus, store, _chain("a"), catalogue=(("a", True),), known=("a", "c"))

    assert started == again == ("a", "c")
    assert (dropped.chain, dropped.models, dropped.before) == ("k", ("b",), ("a", "b", "c"))
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [
        "chain 'k', made or edited by an admin command, names 'b', which is no model id of this "
        "config: taken out of the chain (it was a, b, c; to put it back, add it to models: "
        "again, reload, then llmgw admin chains set_models)"
    ]


def _entries(*models: str) -> tuple[ChainEntry, ...]:
    return tuple(ChainEntry(model=m) for m in models)


async def test_a_snapshot_from_before_counts_as_the_admins(
    bus: InProcessBus, store: SnapshotStore
) -> None:
    class _Old(msgspec.Struct):
        state: ChainState
        seen: tuple[str, ...] = ()

    old = _Old(state=_chain("b"), seen=("a", "b", "c"))
    await store.save(snapshot_name("k"), msgspec.json.encode(old), 0.0, durable=True)

    assert await _run(bus, store, _chain("a")) == ("b",)
