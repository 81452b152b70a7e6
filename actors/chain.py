"""ChainActor: owns one named chain (an ordered list of ``{model, enabled}``).

It answers ``llmgw.chain.<name>.resolve`` (ChainGet -> ChainState) and applies the edits the
SteeringActor forwards on ``llmgw.chain.<name>.edit`` (ChainEdit -> ChainState). Every change
is saved in its snapshot and published on ``llmgw.chain.<name>.state``.

Backfill: the snapshot remembers which catalogue models the chain has seen. A chain that
backfills appends each model the catalogue gained since (a reload) at the next priority,
inheriting that model's own enabled state; a chain only the file shaped drops again the ones
the catalogue lost.

The file and the snapshot: a chain an admin command created or edited is the admin's, and its
snapshot wins over the config file after a restart or a reload. A chain only the file ever
shaped follows the file: the snapshot remembers the file's version it started from, and when
the file says otherwise now, the file's chain is taken (with the models backfill had added,
when it still backfills). A snapshot written before it recorded this counts as the admin's.

A chain the admin's snapshot restores naming a model its config has no id of (the file lost it
while no gateway ran, or a cluster host runs another file) starts without it: a warning and a
``ChainModelsDropped`` on ``llmgw.events.chains`` say so, with the chain as it was. A reload
never gets there: it asks :meth:`ChainActor.would_name_gone` first (through the
SteeringActor) and is refused (``actors.config_owner.check_chains``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import msgspec

from actors.base import Actor, ActorContext, Serve
from schemas import (
    ChainEdit,
    ChainEntry,
    ChainGet,
    ChainModels,
    ChainModelsDropped,
    ChainState,
    GatewayError,
    InvalidRequestError,
    subjects,
)

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping

    from actors.stores.snapshots import SnapshotStore
    from bus import Envelope

logger = logging.getLogger(__name__)

Catalogue = tuple[tuple[str, bool], ...]
"""Every catalogue model id with its own enabled state, in catalogue order."""


class _Snapshot(msgspec.Struct):
    state: ChainState
    seen: tuple[str, ...] = ()
    edited: bool = True  # by an admin command (older snapshots: assume so, they won before)
    file: ChainState | None = None  # the chain as the config file gave it, when not edited


def snapshot_name(chain: str) -> str:
    """The snapshot row of chain ``chain``."""
    return f"chain:{chain}"


def _admins(snap: _Snapshot) -> bool:
    """Whether ``snap`` is a chain an admin shaped, whose snapshot wins over the file."""
    return snap.edited or snap.file is None


def gone_from(state: ChainState, models: Collection[str]) -> ChainModels | None:
    """The models ``state`` names that are none of ``models`` (a config's model ids), in
    chain order, with the entries left without them; None when it names none. What a chain
    must never run with."""
    gone = tuple(e.model for e in state.models if e.model not in models)
    if not gone:
        return None
    kept = tuple(e for e in state.models if e.model in models)
    return ChainModels(chain=state.name, models=gone, kept=kept)


async def naming_gone(
    names: Iterable[str],
    running: Mapping[str, ChainActor],
    snapshots: SnapshotStore | None,
    models: Collection[str],
) -> tuple[ChainModels, ...]:
    """Which of the chains ``names`` (those that would run on a new config), started on a
    config whose model ids are ``models``, would name a model none of those: each as its
    ChainActor in ``running`` holds it now or, not running now (a configured chain the file
    lists again), as its snapshot keeps it. Only a chain an admin shaped can: it outlives a
    restart or a reload as it is (one only the file shaped follows the file)."""
    known = frozenset(models)
    gone: list[ChainModels] = []
    for name in names:
        chain = running.get(name)
        if chain is not None:
            named = chain.would_name_gone(known)
        else:
            snap = await snapshots.load_as(snapshot_name(name), _Snapshot) if snapshots else None
            named = gone_from(snap.state, known) if snap is not None and _admins(snap) else None
        if named is not None:
            gone.append(named)
    return tuple(gone)


class ChainActor(Actor):
    """One per chain. Answers (as ErrorReply) InvalidRequestError for a refused edit."""

    def __init__(
        self,
        initial: ChainState,
        catalogue: Catalogue,
        *,
        snapshots: SnapshotStore | None = None,
        fresh: bool = False,
        known: Collection[str] | None = None,
    ) -> None:
        """``known``: every model id of the config (default: the catalogue's)."""
        self.name = f"chain:{initial.name}"
        self.state = initial
        self._initial = initial
        self._catalogue = catalogue
        self._known = frozenset(known if known is not None else (m for m, _ in catalogue))
        self._snapshots = snapshots
        self._fresh = fresh
        self._edited = fresh  # a chain an admin command creates is the admin's from the start
        self.serves = (
            Serve(subjects.chain_resolve(initial.name)),
            Serve(subjects.chain_edit(initial.name)),
        )

    async def on_start(self, ctx: ActorContext) -> None:
        """Restore the snapshot (unless fresh), backfill, save and publish."""
        self.ctx = ctx
        seen: tuple[str, ...] = tuple(m for m, _ in self._catalogue)
        snap = None if self._fresh else await self._load()
        if snap is not None:
            self._edited = _admins(snap)
            if self._edited or _same_chain(snap.file, self._initial):
                self.state = snap.state
            else:
                self.state = _file_changed(snap, self._initial)
            if not self._edited:
                self.state = _drop_gone(self.state, self._catalogue, self._initial)
            if self.state.backfill:
                self.state = _backfill(self.state, self._catalogue, set(snap.seen))
            if self._edited:
                await self._drop_unknown()
        await self._save(seen)
        await self._publish()

    def would_name_gone(self, models: Collection[str]) -> ChainModels | None:
        """What this chain would still name, restarted on a config whose model ids are
        ``models``, that is none of them (None: nothing): an admin's chain outlives a reload
        as it is; one only the file shaped follows the file and names none."""
        return gone_from(self.state, models) if self._edited else None

    async def _drop_unknown(self) -> None:
        """Take out of an admin's chain the models the config has no id of, loudly: it would
        name a model nothing serves (startup refuses a file whose chains do; this chain is
        not in the file, and only a running gateway can edit it)."""
        gone = gone_from(self.state, self._known)
        if gone is None:
            return
        before = tuple(e.model for e in self.state.models)
        self.state = msgspec.structs.replace(self.state, models=gone.kept, seq=self.state.seq + 1)
        logger.warning(
            "chain %r, made or edited by an admin command, names %s, which %s of this "
            "config: taken out of the chain (it was %s; to put it back, add it to models: "
            "again, reload, then llmgw admin chains set_models)",
            self.state.name,
            " and ".join(repr(m) for m in gone.models),
            "is no model id" if len(gone.models) == 1 else "are no model ids",
            ", ".join(before),
        )
        event = ChainModelsDropped(
            chain=self.state.name, models=gone.models, before=before, ts=self.ctx.clock()
        )
        try:
            await self.ctx.publish(subjects.event("chains"), event)
        except GatewayError as exc:  # the chain is right; the alert is best effort
            logger.warning("chains event not published: %s", exc)

    async def _load(self) -> _Snapshot | None:
        if self._snapshots is None:
            return None
        return await self._snapshots.load_as(snapshot_name(self.state.name), _Snapshot)

    async def _save(self, seen: tuple[str, ...] | None = None, *, durable: bool = False) -> None:
        if self._snapshots is None:
            return
        known = seen if seen is not None else tuple(m for m, _ in self._catalogue)
        await self._snapshots.save(
            snapshot_name(self.state.name),
            msgspec.json.encode(
                _Snapshot(
                    state=self.state,
                    seen=known,
                    edited=self._edited,
                    file=None if self._edited else self._initial,
                )
            ),
            self.ctx.clock(),
            durable=durable,
        )

    async def _publish(self) -> None:
        await self.ctx.publish(subjects.chain_state(self.state.name), self.state)

    async def handle(self, env: Envelope) -> None:
        """ChainGet and ChainEdit."""
        match env.message:
            case ChainGet():
                await env.respond(self.state)
            case ChainEdit() as edit:
                models = apply_edit(self.state.models, edit, self._catalogue)
                backfill = edit.backfill if edit.verb == "set_backfill" else self.state.backfill
                self.state = msgspec.structs.replace(
                    self.state, models=models, backfill=backfill, seq=self.state.seq + 1
                )
                self._edited = True
                await self._save(durable=True)  # an operator's answer means it is stored
                await self._publish()
                await env.respond(self.state)


def _same_chain(a: ChainState | None, b: ChainState) -> bool:
    return a is not None and (a.org, a.backfill, a.models) == (b.org, b.backfill, b.models)


def _file_changed(snap: _Snapshot, file: ChainState) -> ChainState:
    """The chain the config file gives now, for a chain no admin command touched: the
    file's models, then (when it backfills) the ones backfill had added and the file does
    not name."""
    assert snap.file is not None
    logger.info("chain %s follows the config file's change", file.name)
    models = file.models
    if file.backfill:
        given = {e.model for e in (*snap.file.models, *file.models)}
        models = (*models, *(e for e in snap.state.models if e.model not in given))
    return msgspec.structs.replace(file, models=models, seq=snap.state.seq + 1)


def _drop_gone(state: ChainState, catalogue: Catalogue, file: ChainState) -> ChainState:
    """A chain only the file shaped, without the models backfill added that the catalogue
    lost since (a reload removed them): it follows the file, as backfill follows it in. A
    chain an admin shaped keeps them: a reload that would leave it so is refused
    (``actors.config_owner``), a start drops them loudly (``ChainActor._drop_unknown``)."""
    known = {m for m, _ in catalogue} | {e.model for e in file.models}
    kept = tuple(e for e in state.models if e.model in known)
    if len(kept) == len(state.models):
        return state
    gone = ", ".join(e.model for e in state.models if e.model not in known)
    logger.info("chain %s no longer names %s (gone from the catalogue)", state.name, gone)
    return msgspec.structs.replace(state, models=kept, seq=state.seq + 1)


def _backfill(state: ChainState, catalogue: Catalogue, seen: set[str]) -> ChainState:
    named = {e.model for e in state.models}
    added = tuple(
        ChainEntry(model=m, enabled=on) for m, on in catalogue if m not in seen and m not in named
    )
    if not added:
        return state
    logger.info("chain %s backfilled with %s", state.name, ", ".join(e.model for e in added))
    return msgspec.structs.replace(state, models=(*state.models, *added), seq=state.seq + 1)


def check_models(models: tuple[ChainEntry, ...], catalogue: Catalogue) -> None:
    """Refuse a list naming a model twice or one that is not in the catalogue. Raises
    InvalidRequestError naming ``models``."""
    known = {m for m, _ in catalogue}
    seen: set[str] = set()
    for e in models:
        if e.model not in known:
            raise InvalidRequestError(f"'models': {e.model!r} is no model id", param="models")
        if e.model in seen:
            raise InvalidRequestError(f"'models': {e.model!r} is named twice", param="models")
        seen.add(e.model)


def apply_edit(
    models: tuple[ChainEntry, ...], edit: ChainEdit, catalogue: Catalogue
) -> tuple[ChainEntry, ...]:
    """The chain's positions after ``edit``. Raises InvalidRequestError naming the field."""
    if edit.verb == "set_models":
        check_models(edit.models, catalogue)
        return edit.models
    if edit.verb == "set_backfill":
        return models
    if edit.verb == "preset":
        return _preset(models, edit.order)
    index = next((i for i, e in enumerate(models) if e.model == edit.model), None)
    if index is None:
        raise InvalidRequestError(f"'model': {edit.model!r} is not in this chain", param="model")
    if edit.verb == "set_enabled":
        return tuple(
            msgspec.structs.replace(e, enabled=edit.enabled) if i == index else e
            for i, e in enumerate(models)
        )
    if edit.verb == "move":
        if not 1 <= edit.position <= len(models):
            raise InvalidRequestError(
                f"'position' must be between 1 and {len(models)}", param="position"
            )
        rest = [e for i, e in enumerate(models) if i != index]
        rest.insert(edit.position - 1, models[index])
        return tuple(rest)
    raise InvalidRequestError(f"unknown chain edit {edit.verb!r}")


def _preset(models: tuple[ChainEntry, ...], order: tuple[str, ...]) -> tuple[ChainEntry, ...]:
    """Reorder by ``order``, writing priority only: a named model keeps its enabled state, a
    catalogue model not named yet is written in switched off, and a named model the order
    does not know (gone from the catalogue) goes last."""
    named = {e.model: e for e in models}
    ranked = [named.get(m) or ChainEntry(model=m, enabled=False) for m in order]
    rest = [e for e in models if e.model not in set(order)]
    return (*ranked, *rest)
