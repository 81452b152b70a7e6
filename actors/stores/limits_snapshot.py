"""The LimitsActor's state as snapshots of its unit (JetStream, in a cluster).

With several actors hosts the owner of the limits may be killed and taken over by another
host at any moment, so its state must be where every host reads it, written only under the
owner's lease: the unit's ``SnapshotStore`` (``actors.cluster.FencedSnapshots``). Names:

- ``limits:specs``: every limit by subject (written on ``set`` and ``clear``);
- ``limits:subjects``: the subjects that have counters (the bucket is read by name);
- ``limits:counters:<subject>``: one subject's counters (windows, budget spent);
- ``limits:leases``: the leases running (their slots, reservations, window slices);
- ``limits:settled:<n>``: a ring of :data:`SETTLED_SLOTS` slices of :data:`SETTLED_SLICE_S`
  seconds each, the request ids whose settles the counters hold (an ingress sends a settle
  not acknowledged again every second, so two minutes of them spans any takeover).

Every change that must not be lost is in one save before it is answered (the actor groups
what arrives meanwhile into the next save), so a snapshot never lags what a client was
told: no replay is needed, and a new owner holds every limit exactly. The saves are
``durable`` (waited for until written; a save refused because the lease is lost raises, so
nothing it held is answered).
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

import msgspec

from actors.state.limit_counters import CountersSnapshot
from actors.state.limit_leases import LeaseSnapshot
from actors.stores.limits import CountersSave, LimitsLoaded
from schemas.limits import LimitSpec

if TYPE_CHECKING:
    from collections.abc import Awaitable, Sequence

    from actors.stores.snapshots import SnapshotStore

SPECS = "limits:specs"
SUBJECTS = "limits:subjects"
LEASES = "limits:leases"
SETTLED_SLICE_S = 4.0
SETTLED_SLOTS = 32


def counters_name(subject: str) -> str:
    """The snapshot name of ``subject``'s counters."""
    return f"limits:counters:{subject}"


def settled_name(slot: int) -> str:
    """The snapshot name of one slice of the settled ids' ring."""
    return f"limits:settled:{slot}"


class _Slice(msgspec.Struct, frozen=True, kw_only=True):
    """The ids settled in one :data:`SETTLED_SLICE_S` slice (``index``: the slice's number
    since the epoch; a slot holding an older one is overwritten)."""

    index: int
    ids: list[tuple[str, float]]


class SnapshotLimits:
    """Saves and loads the limits' state in ``store``. Raises what ``store`` raises
    (BusClosedError when JetStream cannot be reached)."""

    saves_leases = True

    def __init__(self, store: SnapshotStore) -> None:
        self._store = store
        self._specs: dict[str, LimitSpec] = {}
        self._subjects: set[str] = set()
        self._slices: dict[int, _Slice] = {}

    async def load(self, settled_since: float) -> LimitsLoaded:
        """Everything the last owner saved (ids settled before ``settled_since`` left out)."""
        load = self._store.load_as
        self._specs = await load(SPECS, dict[str, LimitSpec]) or {}
        self._subjects = set(await load(SUBJECTS, list[str]) or [])
        subjects = sorted(self._subjects)
        counters = await asyncio.gather(
            *(load(counters_name(s), CountersSnapshot) for s in subjects)
        )
        slices = await asyncio.gather(
            *(load(settled_name(n), _Slice) for n in range(SETTLED_SLOTS))
        )
        self._slices = {n: s for n, s in enumerate(slices) if s is not None}
        settled = sorted(
            {
                rid: ts for s in self._slices.values() for rid, ts in s.ids if ts >= settled_since
            }.items(),
            key=lambda item: item[1],
        )
        return LimitsLoaded(
            specs=dict(self._specs),
            counters={s: c for s, c in zip(subjects, counters, strict=True) if c is not None},
            settled=settled,
            leases=await load(LEASES, list[LeaseSnapshot]) or [],
        )

    async def save_limit(self, subject: str, spec: LimitSpec | None, now: float) -> None:
        """Store (None: delete) ``subject``'s limit."""
        specs = dict(self._specs)
        if spec is None:
            specs.pop(subject, None)
        else:
            specs[subject] = spec
        await self._store.save(SPECS, msgspec.json.encode(specs), now, durable=True)
        self._specs = specs

    async def save_counters(self, batch: CountersSave) -> None:
        """Save the batch's counters, settled ids and (unless None) leases, at once; old
        settled ids leave with their slice of the ring. Raises the first failure once
        every write ended (a retry writes all of it again)."""
        writes: list[Awaitable[None]] = []
        # Durable: the answers this save holds back are given once it is written.
        save = functools.partial(self._store.save, durable=True)
        now, snaps = batch.now, batch.snaps
        subjects = self._subjects | set(snaps)
        if subjects != self._subjects:
            writes.append(save(SUBJECTS, msgspec.json.encode(sorted(subjects)), now))
        writes += [save(counters_name(s), msgspec.json.encode(c), now) for s, c in snaps.items()]
        slices = self._with_settled(batch.settled)
        writes += [save(settled_name(n), msgspec.json.encode(s), now) for n, s in slices.items()]
        if batch.leases is not None:
            writes.append(save(LEASES, msgspec.json.encode(batch.leases), now))
        # All handed over at once (the store writes them in turn), each waited for to its end.
        for outcome in await asyncio.gather(*writes, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome
        self._subjects = subjects
        self._slices.update(slices)

    def _with_settled(self, settled: Sequence[tuple[str, float]]) -> dict[int, _Slice]:
        """The ring's slots that ``settled`` changes, as they become."""
        by_slice: dict[int, list[tuple[str, float]]] = {}
        for rid, ts in settled:
            by_slice.setdefault(int(ts // SETTLED_SLICE_S), []).append((rid, ts))
        changed: dict[int, _Slice] = {}
        for index, ids in sorted(by_slice.items()):
            slot = index % SETTLED_SLOTS
            current = changed.get(slot) or self._slices.get(slot)
            if current is not None and current.index > index:
                continue  # older than the ring holds (a clock step back): nothing to keep
            kept = current.ids if current is not None and current.index == index else []
            changed[slot] = _Slice(index=index, ids=[*kept, *ids])
        return changed

    async def aclose(self) -> None:
        """Nothing to close: the store belongs to the unit."""
