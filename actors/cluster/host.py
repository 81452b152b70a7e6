"""ClusterHost: this actors host's share of the tree, kept in step with membership.

The host beats every heartbeat, on a fixed cadence of its own: starting and stopping units
(loading snapshots, opening databases) takes long on a busy machine, and a beat queued
behind that work would reach the lease deadline and stop every unit for nothing. After each
beat that landed, a placement round reads the live hosts, computes the owner of each
top-level child of the tree (a *unit*: ``endpoints``, ``models``, ``limits``, ...) with
:func:`owner_of`, and then:

- stops and releases a unit it runs but should not (another host joined: break before
  make, the new owner claims it only once the entry is gone) or whose lease it lost;
- claims and starts a unit it should run and does not, once nobody live holds it; it starts
  from the unit's snapshots in JetStream.

A host that cannot refresh its heartbeat stops every unit before its key can have lapsed
(``ttl - heartbeat`` after the last acknowledged beat was sent), so the survivors' takeover
never meets it still serving; its writes are fenced in any case. From the host, a bucket
electing a new leader (a NATS server died) looks like being cut off; the rule stays the
same, and a ``ttl`` above the election time is what lets a host ride one out (see
``schemas.config.ClusterConfig``): a host cannot tell on its own whether the others reach
JetStream meanwhile, and one that kept serving past its key's lapse could meet its successor.

A dead host is not waited out: the hosts ask each other over core NATS whether they live
(``liveness.py``); a round removes the key of a peer no process answered for long enough,
by compare-and-set on its revision, and takes its units over. The host's actors see the bus
through ``GatedBus``: they answer only within the host's serving lease, so a host taken for
dead while it lived answers for nothing, and its next beat, finding its key gone, stops its
units before it joins again.

A unit's snapshots are written behind its actors (``fenced.py``); a unit released (moved,
handed back, the host stopping) has them written first, within the lease deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import TYPE_CHECKING

from actors.child_spec import ChildSpec, Strategy
from actors.cluster.admin import ClusterAdminActor
from actors.cluster.fenced import SNAPSHOTS_BUCKET, FencedSnapshots
from actors.cluster.gated import GatedBus
from actors.cluster.liveness import ServingLease, Suspects, answer_alive, ask, dead_after
from actors.cluster.membership import (
    HOSTS_BUCKET,
    Membership,
    MembershipLostError,
    NodeIdInUseError,
)
from actors.cluster.placement import OWNERS_BUCKET, Lease, Owners, owner_of
from actors.reconfigure import Change, apply, diff, same_spec, undo
from actors.supervisor import Supervisor
from bus import BusClosedError
from schemas import subjects

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from actors.stores.snapshots import SnapshotStore
    from bus import Bus, KeyValue
    from schemas.config import ClusterConfig

logger = logging.getLogger(__name__)

_OPEN_ATTEMPTS = 15
_MARGIN_S = 0.05  # a beat cut short by the deadline's timeout ends a hair before it


class ClusterHost:
    """Owns this host's running units, their leases and the heartbeat loop.

    ``build(snapshots)`` describes the whole tree with ``snapshots`` as every actor's store;
    the host runs only the units placed on it. ``reconcile`` raises nothing the bus raises
    (a round that cannot reach JetStream is retried next round). ``on_units`` is shown the
    units this host runs each time that changes, once the unit started or stopped (what feeds
    a unit from outside the tree follows it there).
    """

    def __init__(
        self,
        bus: Bus,
        node_id: str,
        settings: ClusterConfig,
        build: Callable[[SnapshotStore | None], Supervisor],
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_units: Callable[[list[str]], None] | None = None,
        config_version: Callable[[], str] | None = None,
    ) -> None:
        self.node_id = node_id
        self._config_version = config_version  # what each beat says this host runs
        self.root = Supervisor("root", strategy=Strategy.ONE_FOR_ONE, intensity=10, period=5.0)
        self._outside = Supervisor("cluster", strategy=Strategy.ONE_FOR_ONE, intensity=10)
        self._bus = bus
        self._settings = settings
        self._build = build
        self._on_units = on_units
        self._clock = clock
        self._sleep = sleep
        self._units = [s.name for s in build(None).specs]
        self._leases: dict[str, Lease] = {}
        self._stores: dict[str, FencedSnapshots] = {}  # each running unit's snapshot writer
        self._lost: set[str] = set()  # units whose fenced write was refused
        # Units stopped without release at a lapsed deadline, until the next placement round.
        self._abandoned: dict[str, Lease] = {}
        self._deadline = 0.0  # stop every unit past this (monotonic): the heartbeat lapsed
        self._unacknowledged = False  # the last beat failed (logged once per outage)
        self._membership: Membership | None = None
        self._owners: Owners | None = None
        self._snapshots: KeyValue | None = None
        self._changing = asyncio.Lock()  # one placement round or lapse at a time
        self._landed = asyncio.Event()  # a beat landed: time for a placement round
        self._tasks: list[asyncio.Task[None]] = []
        # Whether each peer lives, asked over core NATS: a dead one is removed at once.
        self._suspects = Suspects(dead_after(settings.heartbeat_seconds))
        self._lease = ServingLease(clock, dead_after(settings.heartbeat_seconds))
        self._gated = GatedBus(bus, self._lease)  # what this host's actors see
        self._answering: asyncio.Task[None] | None = None
        self._beats = 0  # beats landed
        self._listed_after = -1  # the beats landed when the last listing of the peers began
        self._exits = contextlib.AsyncExitStack()  # the subscription _answering serves

    @property
    def units(self) -> list[str]:
        """The units this host runs now, in tree order."""
        return [u for u in self._units if u in self._leases]

    async def start(self, admit: Callable[[list[str]], None] | None = None) -> None:
        """Open, run a first round, then beat every heartbeat and place after each beat in
        the background.
        ``admit`` is shown the live hosts before this one joins them and raises to refuse.
        Raises BusClosedError when the buckets cannot be opened, what ``admit`` raises."""
        await self.open()
        if admit is not None:
            assert self._membership is not None
            admit(await self._membership.live())
        sent = self._clock()
        await self.reconcile()
        self._tasks = [
            asyncio.create_task(self._beating(sent), name=f"cluster-beat:{self.node_id}"),
            asyncio.create_task(self._placing(), name=f"cluster-place:{self.node_id}"),
            asyncio.create_task(self._asking(), name=f"cluster-ask:{self.node_id}"),
        ]

    async def open(self) -> None:
        """Open the buckets, start the (empty) root and the ``cluster`` admin area (every
        host answers it, outside placement); answer whether this host lives from then on.
        Raises BusClosedError when JetStream refuses the buckets for ``_OPEN_ATTEMPTS``
        seconds, or the bus the subscription."""
        alive = await self._exits.enter_async_context(
            self._bus.subscribe(subjects.cluster_alive(self.node_id))
        )
        self._answering = asyncio.create_task(
            answer_alive(alive, self.node_id), name=f"cluster-alive:{self.node_id}"
        )
        for attempt in range(1, _OPEN_ATTEMPTS + 1):
            try:
                await self._open_buckets()
                break
            except BusClosedError as exc:
                # A cluster starting with us may have no JetStream leader yet.
                if attempt == _OPEN_ATTEMPTS:
                    raise
                logger.warning("cluster buckets not ready (%s); retrying", exc.message)
                await asyncio.sleep(1.0)
        await self.root.start(self._gated)
        assert self._membership is not None and self._owners is not None
        admin = functools.partial(
            ClusterAdminActor, self.node_id, self._units, self._membership, self._owners
        )
        # Outside the serving lease: it reads JetStream only, and answers when we cannot.
        await self._outside.start(self._bus)
        await self._outside.add_child(ChildSpec("cluster_admin", admin))

    async def _open_buckets(self) -> None:
        # Counted from the servers this client sees (fewer while a cluster forms), a default
        # count never lowers what a bucket has; one the operator set is taken as set.
        n, grow = self._settings.replicas_on(self._bus.servers), self._settings.replicas is None
        ttl = self._settings.ttl_seconds
        hosts = await self._bus.key_value(HOSTS_BUCKET, ttl=ttl, replicas=n, grow_only=grow)
        self._membership = Membership(hosts, self.node_id, config=self._config_version)
        owners = await self._bus.key_value(OWNERS_BUCKET, replicas=n, grow_only=grow)
        self._owners = Owners(owners)
        self._snapshots = await self._bus.key_value(SNAPSHOTS_BUCKET, replicas=n, grow_only=grow)

    async def wait(self) -> None:
        """Return (or raise) when the root ends."""
        await self.root.wait()

    async def aclose(self) -> None:
        """Stop the background tasks, stop and release every unit, leave the membership."""
        tasks = [*self._tasks, *([self._answering] if self._answering else [])]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await self._exits.aclose()
        for unit in reversed(self.units):
            await self._drop(unit, release=True)
        await self.root.stop()
        await self._outside.stop()
        if self._membership is not None:
            try:
                await self._membership.leave()
            except BusClosedError:
                logger.info("left without removing the heartbeat: it lapses on its own")

    async def reconcile(self) -> None:
        """One round: heartbeat, then, if it landed, start and stop units to match the
        placement."""
        if await self._heartbeat():
            await self._place_round()

    async def reconfigure(self, build: Callable[[SnapshotStore | None], Supervisor]) -> list[str]:
        """Run the units of the tree ``build`` describes from now on (a config reload): each
        running unit is reconciled with its new description (``actors.reconfigure``: a
        changed child replaced, an added one started, a removed one stopped), a unit the new
        tree no longer has is released, and units started later (a takeover) are built by
        ``build``. Returns the changes, as ``unit/child`` labels. Raises what a child's
        start raises, after putting back what it had changed (the old tree keeps running)."""
        async with self._changing:
            units = [s.name for s in build(None).specs]
            changes: list[Change] = []
            for unit in self.units:
                if unit in units:
                    store = self._stores[unit]
                    old = _spec_named(self._build(store), unit)
                    changes += _unit_changes(old, _spec_named(build(store), unit))
            early = [c for c in changes if c.kind != "remove"]
            done: list[Change] = []
            try:
                await apply(self.root, early, done)
            except Exception:
                await undo(self.root, done)
                raise
            await apply(self.root, [c for c in reversed(changes) if c.kind == "remove"], done)
            self._build, gone, self._units = build, set(self._units) - set(units), units
            for unit in gone & set(self._leases):
                await self._drop(unit, release=True)
        return sorted(f"{c.kind} {c.label}" for c in done)

    async def _heartbeat(self) -> bool:
        """Beat; True when it landed. A beat that finds our id taken, or that fails with the
        lease deadline reached, stops every unit (without releasing)."""
        assert self._membership is not None
        sent = self._clock()
        # While it runs units, a beat may take only until the lease deadline: a host cut off
        # from JetStream must have stopped them before its key can lapse.
        budget = self._deadline - sent if self._leases else None
        try:
            if budget is not None and budget <= 0:
                raise TimeoutError
            async with asyncio.timeout(budget):
                await self._membership.beat()
        except MembershipLostError:
            # A peer took us for dead (or our key lapsed): what we ran under it may be
            # another host's now. Stop it all, then join afresh.
            if self._leases:
                logger.error(
                    "%s: our membership is gone (a peer took this host for dead, or it "
                    "lapsed): stopping every unit and joining again",
                    self.node_id,
                )
            await self._stop_all()
            return await self._heartbeat()  # joins afresh (it has no revision left to lose)
        except NodeIdInUseError as exc:
            # Two processes under one id would each run "its" share: the one that finds its
            # key rewritten by the other stops everything at once and waits for it to lapse.
            logger.error(
                "%s (another process, or our previous run not lapsed yet): running no unit "
                "until it is gone",
                exc,
            )
            await self._stop_all()
            return False
        except (BusClosedError, TimeoutError) as exc:
            why = exc.message if isinstance(exc, BusClosedError) else "no answer in time"
            if self._leases and self._clock() >= self._deadline - _MARGIN_S:
                logger.error("heartbeat lapsed (%s): stopping every unit", why)
                await self._stop_all()
            elif self._leases and not self._unacknowledged:
                logger.warning(
                    "heartbeat not acknowledged (%s): the units keep running for %.1f s more "
                    "(a NATS leader election ends sooner; cut off, they stop then)",
                    why,
                    self._deadline - self._clock(),
                )
            self._unacknowledged = True
            return False
        if self._unacknowledged:
            logger.info("heartbeat acknowledged again on %s", self.node_id)
            self._unacknowledged = False
        self._deadline = sent + self._settings.ttl_seconds - self._settings.heartbeat_seconds
        self._lease.renew(sent)
        self._beats += 1
        return True

    async def _place_round(self) -> None:
        """Read the live hosts and start and stop units to match; a round that cannot reach
        JetStream is cut short (the next beat brings another)."""
        assert self._membership is not None
        async with self._changing:
            try:
                beats = self._beats
                revisions = await self._membership.revisions()
                revisions.pop(self.node_id, None)
                self._suspects.listed(revisions)
                self._listed_after = beats
                for node, revision in self._suspects.dead(self._clock()).items():
                    if await self._remove_dead(node, revision):
                        del revisions[node]
                # The beat landed; a lagging listing must not hide us.
                await self._place(sorted([*revisions, self.node_id]))
            except BusClosedError as exc:
                logger.warning("placement round cut short: %s", exc.message)

    async def _remove_dead(self, node: str, revision: int) -> bool:
        """Remove the key of ``node``, silent for long enough, if a last ask still finds no
        process answering for it and its key is still at ``revision``."""
        assert self._membership is not None
        if await ask(self._bus, self.node_id, node, self._ask_timeout) is not False:
            return False
        if not await self._membership.remove(node, revision):
            return False
        logger.warning(
            "%s: host %s is gone (no process answers for it): removed its membership to take "
            "its units over",
            self.node_id,
            node,
        )
        return True

    async def ask_round(self) -> None:
        """Ask every peer listed whether it lives (or this host, with none): renew the
        serving lease when all answered and the listing followed our last beat, and start a
        placement round when one is found dead."""
        peers = self._suspects.peers
        fresh = self._listed_after == self._beats
        sent = self._clock()
        targets = peers or [self.node_id]
        answers = await asyncio.gather(
            *(ask(self._bus, self.node_id, node, self._ask_timeout) for node in targets)
        )
        now = self._clock()
        for peer, answer in zip(peers, answers, strict=False):
            self._suspects.heard(peer, silent=answer is False, now=now)
        if fresh and all(answers):
            self._lease.vouched(sent)
        if self._suspects.dead(now):
            self._landed.set()

    @property
    def _ask_timeout(self) -> float:
        return min(1.0, self._settings.heartbeat_seconds)

    async def _asking(self) -> None:
        period = self._settings.heartbeat_seconds / 4
        while True:
            started = self._clock()
            try:
                await self.ask_round()
            except Exception:
                logger.exception("asking the peers failed on %s", self.node_id)
            await self._sleep(max(0.0, started + period - self._clock()))

    async def _stop_all(self) -> None:
        """Stop every unit without releasing it (its entry is left to lapse or be taken;
        a unit not ours on our return is released then, see ``_place``)."""
        self._lease.end()
        async with self._changing:
            for unit in reversed(self.units):
                self._abandoned[unit] = self._leases[unit]
                await self._drop(unit, release=False)

    async def _place(self, live: list[str]) -> None:
        assert self._owners is not None
        # Units stopped at a lapsed deadline still name us while our key lives: the ones no
        # longer ours are released, or their owner could never take them from a live host
        # (ours are claimed again below, under a new revision).
        for unit, stale in list(self._abandoned.items()):
            if owner_of(unit, live) != self.node_id:
                await self._owners.release(stale)  # a no-op once someone else took it
            del self._abandoned[unit]
        for unit in reversed(self._units):  # stops in reverse tree order
            lease = self._leases.get(unit)
            if lease is None:
                continue
            if unit in self._lost or owner_of(unit, live) != self.node_id:
                await self._drop(unit, release=True)
            elif not await self._owners.holds(lease):
                await self._drop(unit, release=False)
        for unit in self._units:  # starts in tree order
            if unit in self._leases or owner_of(unit, live) != self.node_id:
                continue
            if self._clock() >= self._deadline:
                return  # the beat this round followed is too old to start anything on
            lease = await self._owners.claim(unit, self.node_id, live)
            if lease is not None:
                await self._run(unit, lease)

    async def _run(self, unit: str, lease: Lease) -> None:
        assert self._owners is not None and self._snapshots is not None
        self._lost.discard(unit)
        store = FencedSnapshots(
            self._snapshots, self._owners, lease, on_lost=lambda: self._lost.add(unit)
        )
        spec = _spec_named(self._build(store), unit)
        index = sum(1 for u in self.units if self._units.index(u) < self._units.index(unit))
        self._leases[unit] = lease
        self._stores[unit] = store
        try:
            await self.root.add_child(spec, index=index)
        except Exception as exc:  # e.g. a peer unit it seeds from is not up yet: next round
            logger.warning("unit %s did not start on %s: %r", unit, self.node_id, exc)
            del self._leases[unit]
            await self._stores.pop(unit).aclose()
            await self._owners.release(lease)
            return
        logger.info("%s owns %s (revision %d)", self.node_id, unit, lease.revision)
        self._units_changed()

    async def _drop(self, unit: str, *, release: bool) -> None:
        lease = self._leases.pop(unit)
        self._lost.discard(unit)
        # Its feeders stop first: the next owner's start only after the release below.
        self._units_changed()
        try:
            await self.root.remove_child(unit)  # its actors hand their last snapshots over
        except KeyError:
            pass  # it had exited
        store = self._stores.pop(unit)
        # Released, the unit is the next owner's, which loads its snapshots at once: they
        # must be written first. The writes can land only while our heartbeat holds (after
        # that they are fenced off), so waiting longer would only delay our next beat.
        if release and not await store.drain(self._deadline - self._clock() - _MARGIN_S):
            logger.error(
                "%s releases %s with snapshots not written (JetStream did not take them before "
                "the lease deadline): the next owner starts from the previous ones",
                self.node_id,
                unit,
            )
        await store.aclose()
        if release and self._owners is not None:
            try:
                await self._owners.release(lease)
            except BusClosedError:
                logger.info("could not release %s: its entry lapses with our heartbeat", unit)
        logger.info("%s gave up %s", self.node_id, unit)

    def _units_changed(self) -> None:
        if self._on_units is not None:
            self._on_units(self.units)

    async def _beating(self, sent: float) -> None:
        period = self._settings.heartbeat_seconds
        while True:
            # The cadence counts from each beat's start, so a slow beat is not followed by
            # a full period more before the next one.
            await self._sleep(max(0.0, sent + period - self._clock()))
            sent = self._clock()
            try:
                if await self._heartbeat():
                    self._landed.set()
            except Exception:
                # A failed beat must not end the loop: without it this host would keep its
                # units with no heartbeat, while the others take them over.
                logger.exception("heartbeat failed on %s", self.node_id)
                if self._clock() >= self._deadline:
                    await self._stop_all()

    async def _placing(self) -> None:
        while True:
            await self._landed.wait()
            self._landed.clear()
            try:
                await self._place_round()
            except Exception:
                logger.exception("placement round failed on %s", self.node_id)


def _unit_changes(old: ChildSpec | Supervisor, new: ChildSpec | Supervisor) -> list[Change]:
    """What turns running unit ``old`` into ``new`` (a nested supervisor child by child)."""
    if isinstance(old, Supervisor) and isinstance(new, Supervisor):
        return diff(old, new, (old.name,))
    # The tree's shape is code, not config: a unit is a supervisor in both or in neither.
    assert isinstance(old, ChildSpec) and isinstance(new, ChildSpec)
    return [] if same_spec(old, new) else [Change("replace", (), new.name, new, old=old)]


def _spec_named(root: Supervisor, name: str) -> ChildSpec | Supervisor:
    nested = root.nested(name)
    if nested is not None:
        return nested
    return next(s for s in root.specs if s.name == name)
