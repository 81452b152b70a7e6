"""SteeringActor: owns the deployment's steering — settings, which chains exist, and the
scoring evidence — and runs one ChainActor per chain.

- Admin areas ``chains`` (list, get, create, delete, set_models, move, set_enabled, preset,
  set_backfill, activate) and ``steering`` (get, set_profile, set_guardrails,
  set_exploration). Edits of one chain are forwarded to its ChainActor, which owns it.
- ``llmgw.steering.get``: a SteeringSnapshot for an ingress view that starts; every change
  of settings or of the set of chains is published on ``llmgw.steering.state``.
- ``llmgw.steering.check``: a reload's question, before it changes anything: which chains
  would name a model the new config lacks (``actors.chain.naming_gone``).
- Scoring: it learns from every Observation, EndpointState and mode change (an
  :class:`EvidenceBook`) and publishes ``Evidence`` on ``llmgw.steering.evidence`` as an
  :class:`EvidenceGate` times it: at once when an interval (``_FLUSH_SECONDS``) passed
  since the last publish or when the change flips an ordering, a model's health or the
  mode; else at the interval's end. While a rate-limit penalty wears off it checks every
  ``_DECAY_SECONDS`` whether the decay flipped an ordering, and publishes only then (and
  when the decay ends). So an ingress ranks locally, with no bus hop per request.

Settings, the chain directory and the evidence are saved in the ``steering`` snapshot; each
chain in its own. The chains run inside this actor's task group: a ChainActor that crashes
crashes this actor, and its supervisor restarts both from their snapshots (one for all).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from actors.admin import AdminArea, text_arg
from actors.base import Actor, ActorContext, Serve
from actors.chain import Catalogue, ChainActor, check_models, naming_gone
from actors.state.evidence_gate import EvidenceGate
from actors.state.scoring import BookSnapshot, EvidenceBook
from actors.state.steering_settings import (
    CHAINS_ARGS,
    STEERING_ARGS,
    chain_edit_arg,
    chain_names,
    chain_view,
    configured_state,
    fraction,
    initial_chains,
    lost_active,
    new_chain_arg,
    settings_view,
    starting_state,
    with_active_running,
    with_guardrails,
    with_profile,
)
from schemas import (
    AdminCommand,
    ChainEdit,
    ChainsCheck,
    ChainsChecked,
    ChainState,
    EndpointState,
    Evidence,
    InvalidRequestError,
    ModeChanged,
    Observation,
    RouteNotFoundError,
    SteeringGet,
    SteeringSnapshot,
    SteeringState,
    is_backpressure,
    raise_for_reply,
    subjects,
)
from schemas.catalog import PRESETS, ascii_lower
from schemas.scoring import capability_scores, evidence_signature, preset_order

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable

    from anyio.abc import TaskGroup

    from actors.admin import AdminHandler
    from actors.stores.snapshots import SnapshotStore
    from bus import Envelope
    from schemas.catalog import ChainConfig, SteeringConfig
    from schemas.config import ModelConfig

logger = logging.getLogger(__name__)

_FLUSH_SECONDS = 0.2
_FLIPS_PER_FLUSH = 4  # flips published at once per interval; more wait for its end
_DECAY_SECONDS = 1.0
# Evidence reaches the views every 0.2 s but the disk at most every 5 s: under traffic a
# save per flush was five SQLite commits a second. A kill -9 loses at most the last 5 s of
# evidence and allowance counts; a clean stop loses nothing (on_stop saves).
_SAVE_SECONDS = 5.0
_EDIT_TIMEOUT = 5.0
_SNAPSHOT = "steering"


@dataclass(frozen=True, slots=True)
class _Flush:
    """Local timer message: publish the evidence."""


@dataclass(frozen=True, slots=True)
class _DecayCheck:
    """Local timer message: publish if a wearing-off penalty flipped an ordering."""


@dataclass(frozen=True, slots=True)
class _Save:
    """Local timer message: save the snapshot with the evidence learnt since the last."""


class _Snapshot(msgspec.Struct):
    state: SteeringState | None = None
    file: SteeringState | None = None  # the file's settings beside it (None: from before)
    created: dict[str, ChainState] = {}  # chains made by admin commands, as created
    deleted: tuple[str, ...] = ()  # chains of the config an admin deleted
    evidence: BookSnapshot = msgspec.field(default_factory=BookSnapshot)


class SteeringActor(Actor):
    """Answers (as ErrorReply) InvalidRequestError for a refused command, RouteNotFoundError
    for an unknown chain."""

    flush_seconds = _FLUSH_SECONDS  # the evidence publish interval (read at start)

    def __init__(
        self,
        models: tuple[ModelConfig, ...],
        chains: tuple[ChainConfig, ...],
        steering: SteeringConfig,
        *,
        snapshots: SnapshotStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = "steering"
        self._configured_chains = chains
        self._steering = steering
        self._snapshots = snapshots
        self._clock = clock
        self._model_ids = frozenset(m.id for m in models)
        self._catalogue_models = tuple(m for m in models if m.published)
        self._capability = capability_scores(
            [m for m in self._catalogue_models if m.catalog.enabled]
        )
        self._catalogue: Catalogue = tuple(
            (m.id, m.catalog.enabled) for m in self._catalogue_models
        )
        # Models whose successes can flip an ordering at once: their allowance use moves
        # their multiplier (see _may_flip).
        self._with_allowance = frozenset(
            m.id for m in self._catalogue_models if m.catalog.free_allowance is not None
        )
        self.chains_admin = AdminArea(
            "chains",
            {
                "list": self._list,
                "get": self._get,
                "create": self._create,
                "delete": self._delete,
                "set_models": self._editing("set_models"),
                "move": self._editing("move"),
                "set_enabled": self._editing("set_enabled"),
                "preset": self._preset,
                "set_backfill": self._editing("set_backfill"),
                "activate": self._activate,
            },
            args=CHAINS_ARGS,
        )
        self.steering_admin = AdminArea(
            "steering",
            {
                "get": self._settings,
                "set_profile": self._set_profile,
                "set_guardrails": self._set_guardrails,
                "set_exploration": self._set_exploration,
            },
            args=STEERING_ARGS,
        )
        self.serves = (
            self.chains_admin.serve,
            self.steering_admin.serve,
            Serve(subjects.STEERING_GET),
            Serve(subjects.STEERING_CHECK),
            Serve(subjects.OBSERVATION_ANY),
            Serve(subjects.ENDPOINT_STATE_ANY),
            Serve(subjects.event("mode")),
        )

    # -- lifecycle ----------------------------------------------------------------------

    async def on_start(self, ctx: ActorContext) -> None:
        """Restore settings, directory and evidence; start every chain; publish."""
        self.ctx = ctx
        self._book = EvidenceBook(self._catalogue_models)
        self._degraded = False
        self._seq = 0
        self._gate = EvidenceGate(self.flush_seconds, _FLIPS_PER_FLUSH)
        self._flush_pending = False
        self._decay_pending = False
        self._save_pending = False
        self._chains: dict[str, ChainActor] = {}
        snap = await self._load()
        self._book.restore(snap.evidence)
        self._created = dict(snap.created)
        self._deleted = set(snap.deleted)
        self._state = starting_state(snap.state, snap.file, configured_state(self._steering))
        ready = anyio.Event()
        ctx.start_soon(lambda: self._host_chains(ready))
        await ready.wait()
        for initial in initial_chains(self._configured_chains, self._created, self._deleted):
            await self._start_chain(initial, fresh=False)
        self._state = msgspec.structs.replace(self._state, chains=tuple(sorted(self._chains)))
        self._state = with_active_running(self._state, self._chains)
        await self._changed(durable=False)
        await self._publish_evidence()

    async def _host_chains(self, ready: anyio.Event) -> None:
        """The task group the ChainActors run in, for as long as this actor runs."""
        async with anyio.create_task_group() as tg:
            self._tg: TaskGroup = tg
            ready.set()
            await anyio.sleep_forever()

    async def _start_chain(self, initial: ChainState, *, fresh: bool) -> ChainActor:
        chain = ChainActor(
            initial, self._catalogue, snapshots=self._snapshots, fresh=fresh, known=self._model_ids
        )
        await self._tg.start(
            lambda task_status: chain.run(self.ctx.bus, clock=self._clock, task_status=task_status)
        )
        self._chains[initial.name] = chain
        return chain

    async def on_stop(self) -> None:
        """Save the evidence not flushed yet."""
        await self._save()

    async def _load(self) -> _Snapshot:
        if self._snapshots is None:
            return _Snapshot()
        return await self._snapshots.load_as(_SNAPSHOT, _Snapshot) or _Snapshot()

    async def _save(self, *, durable: bool = False) -> None:
        if self._snapshots is None:
            return
        snap = _Snapshot(
            state=self._state,
            file=configured_state(self._steering),
            created=self._created,
            deleted=tuple(sorted(self._deleted)),
            evidence=self._book.snapshot(),
        )
        await self._snapshots.save(
            _SNAPSHOT, msgspec.json.encode(snap), self._clock(), durable=durable
        )

    async def _changed(self, *, durable: bool = True) -> None:
        """Settings or the set of chains changed: save (stored before an operator's command
        answers, unless ``durable`` is off) and publish."""
        self._seq += 1
        self._state = msgspec.structs.replace(self._state, seq=self._seq)
        await self._save(durable=durable)
        await self.ctx.publish(subjects.STEERING_STATE, self._state)

    # -- messages -----------------------------------------------------------------------

    async def handle(self, env: Envelope) -> None:
        """Admin commands, snapshot requests, and the events the evidence is learned from."""
        match env.message:
            case Observation() as obs:
                if self._book.learn(obs, self._clock()):
                    await self._evidence_changed(flips=self._may_flip(obs))
            case EndpointState() as st:
                if self._book.endpoint(st):
                    await self._evidence_changed()
            case ModeChanged() as mode:
                degraded = mode.mode == "degraded"
                if degraded != self._degraded:
                    self._degraded = degraded
                    # /health says degraded: exploration must stop with the next request.
                    await self._evidence_changed(force=True)
            case SteeringGet():
                await env.respond(
                    SteeringSnapshot(
                        state=self._state,
                        chains=tuple(c.state for c in self._chains.values()),
                        evidence=self._evidence(),
                    )
                )
            case ChainsCheck() as check:
                names = chain_names(check.chains, self._created, self._deleted)
                gone = await naming_gone(names, self._chains, self._snapshots, check.models)
                lost = lost_active(self._state, configured_state(self._steering), names)
                await env.respond(ChainsChecked(gone=gone, active=lost))
            case _:
                for area in (self.chains_admin, self.steering_admin):
                    if area.owns(env):
                        await area.answer(self.ctx, env)

    async def handle_local(self, msg: object) -> None:
        """Timers: the trailing publish, the decay check, the snapshot save."""
        if isinstance(msg, _Save):
            self._save_pending = False
            await self._save()
        elif isinstance(msg, _Flush):
            self._flush_pending = False
            if self._gate.dirty:
                await self._publish_evidence()
        elif isinstance(msg, _DecayCheck):
            self._decay_pending = False
            now = self._clock()
            decaying = self._book.decaying(self._state.guardrails, now)
            # The views hold the multipliers of the last publish; only a decay that flips an
            # ordering (or ends, leaving exact multipliers of 1) is worth a publish.
            if not decaying or self._gate.flipped(self._current_signature()):
                await self._publish_evidence()
            else:
                self._check_decay()

    def _may_flip(self, obs: Observation) -> bool:
        """Whether ``obs`` is worth checking for a flipped ordering at once: a failure,
        back-pressure, or the use of an allowance. A plain success nudges speed and
        reliability and is published at the interval's end (at most ``flush_seconds``
        later): ranking the whole catalogue on every success cost about 150 us of CPU per
        request at concurrency 64."""
        return obs.outcome != "success" or is_backpressure(obs) or obs.model in self._with_allowance

    async def _evidence_changed(self, *, force: bool = False, flips: bool = True) -> None:
        """Publish the evidence now or at the interval's end, as the gate says (``flips``:
        whether this change is checked for a flipped ordering at once)."""
        now = self._clock()
        signature = self._current_signature if flips else None
        if self._gate.changed(now, signature, force=force):
            await self._publish_evidence()
        elif not self._flush_pending:
            self._flush_pending = True
            self.ctx.call_later(self._gate.due(now), _Flush())

    async def _publish_evidence(self) -> None:
        now = self._clock()
        evidence = self._evidence()
        await self.ctx.publish(subjects.STEERING_EVIDENCE, evidence)
        self._gate.published(self._signature(evidence), now)
        if not self._save_pending:
            self._save_pending = True
            self.ctx.call_later(_SAVE_SECONDS, _Save())
        if self._book.decaying(self._state.guardrails, now):
            self._check_decay()

    def _check_decay(self) -> None:
        if not self._decay_pending:
            self._decay_pending = True
            self.ctx.call_later(_DECAY_SECONDS, _DecayCheck())

    def _current_signature(self) -> Hashable:
        """:meth:`_signature` of the evidence now. A catalogue of fewer than two models has
        one ordering whatever its evidence: only the mode can change, and building and
        ranking the evidence on every observation would cost the request path (measured:
        about 150 us of CPU per request at concurrency 64 with one model)."""
        if len(self._catalogue_models) < 2:
            return (), self._degraded
        return self._signature(self._evidence())

    def _signature(self, evidence: Evidence) -> Hashable:
        models, weights = self._catalogue_models, self._state.weights
        return evidence_signature(models, evidence, weights, self._capability)

    def _evidence(self) -> Evidence:
        self._seq += 1
        return self._book.evidence(
            self._state.guardrails, self._clock(), degraded=self._degraded, seq=self._seq
        )

    # -- admin: chains ------------------------------------------------------------------

    def _chain(self, cmd: AdminCommand) -> ChainActor:
        name = ascii_lower(text_arg(cmd, "name"))
        chain = self._chains.get(name)
        if chain is None:
            raise RouteNotFoundError(f"no chain {name!r}")
        return chain

    async def _edit(self, cmd: AdminCommand, edit: ChainEdit) -> dict[str, Any]:
        chain = self._chain(cmd)
        reply = await self.ctx.bus.request(
            subjects.chain_edit(chain.state.name),
            edit,
            reply_type=ChainState,
            timeout=_EDIT_TIMEOUT,
        )
        return chain_view(raise_for_reply(reply))

    async def _list(self, cmd: AdminCommand) -> dict[str, Any]:
        org = cmd.args.get("org")
        return {
            "chains": [
                chain_view(c.state)
                for n, c in sorted(self._chains.items())
                if org is None or c.state.org == org
            ],
            "active_chain": self._state.active_chain,
        }

    async def _get(self, cmd: AdminCommand) -> dict[str, Any]:
        return chain_view(self._chain(cmd).state)

    async def _create(self, cmd: AdminCommand) -> dict[str, Any]:
        initial = new_chain_arg(cmd, self._chains)
        check_models(initial.models, self._catalogue)
        chain = await self._start_chain(initial, fresh=True)
        self._created[initial.name] = initial
        self._deleted.discard(initial.name)
        self._state = msgspec.structs.replace(self._state, chains=tuple(sorted(self._chains)))
        await self._changed()
        return chain_view(chain.state)

    async def _delete(self, cmd: AdminCommand) -> dict[str, Any]:
        chain = self._chain(cmd)
        name = chain.state.name
        if name == self._state.active_chain:
            raise InvalidRequestError(
                f"'name': chain {name!r} is the active chain; activate another (or none) first",
                param="name",
            )
        chain.request_stop()
        del self._chains[name]
        self._created.pop(name, None)
        if any(c.name == name for c in self._configured_chains):
            self._deleted.add(name)
        self._state = msgspec.structs.replace(self._state, chains=tuple(sorted(self._chains)))
        await self._changed()
        return {"deleted": name}

    def _editing(self, verb: str) -> AdminHandler:
        """The handler of ``chains <verb>``: the edit forwarded to the chain's owner."""

        async def edit(cmd: AdminCommand) -> dict[str, Any]:
            return await self._edit(cmd, chain_edit_arg(verb, cmd))

        return edit

    async def _preset(self, cmd: AdminCommand) -> dict[str, Any]:
        preset = text_arg(cmd, "preset")
        if preset not in PRESETS:
            raise InvalidRequestError(
                f"'preset' must be one of {', '.join(PRESETS)}", param="preset"
            )
        evidence = {e.model: e for e in self._evidence().models}
        order = preset_order(preset, self._catalogue_models, evidence)
        return await self._edit(cmd, ChainEdit(verb="preset", order=tuple(order)))

    async def _activate(self, cmd: AdminCommand) -> dict[str, Any]:
        name = None
        if cmd.args.get("name") is not None:
            chain = self._chain(cmd)
            if chain.state.org:
                raise InvalidRequestError(
                    "'name': the active chain must be deployment-wide "
                    f"(chain {chain.state.name!r} belongs to an "
                    "organisation)",
                    param="name",
                )
            name = chain.state.name
        self._state = msgspec.structs.replace(self._state, active_chain=name)
        await self._changed()
        return settings_view(self._state)

    # -- admin: steering ----------------------------------------------------------------

    async def _settings(self, cmd: AdminCommand) -> dict[str, Any]:
        evidence = self._evidence()
        return {
            **settings_view(self._state),
            "degraded": evidence.degraded,
            "month": evidence.month,
            "evidence": {e.model: msgspec.structs.asdict(e) for e in evidence.models},
        }

    async def _set_profile(self, cmd: AdminCommand) -> dict[str, Any]:
        self._state = with_profile(self._state, cmd)
        await self._changed()
        return settings_view(self._state)

    async def _set_guardrails(self, cmd: AdminCommand) -> dict[str, Any]:
        self._state = with_guardrails(self._state, cmd)
        await self._changed()
        await self._evidence_changed()  # the multipliers read the thresholds
        return settings_view(self._state)

    async def _set_exploration(self, cmd: AdminCommand) -> dict[str, Any]:
        value = fraction(cmd.args.get("exploration"), "exploration")
        self._state = msgspec.structs.replace(self._state, exploration=value)
        await self._changed()
        return settings_view(self._state)
