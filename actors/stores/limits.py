"""The LimitsActor's tables in the shared SQLite file: the limits, and its counters' snapshots.

``limits`` holds one row per subject (its ``LimitSpec`` as JSON); ``limit_counters`` one
snapshot per subject; ``limit_settled`` the request ids whose settles those snapshots include
(the last ten minutes' worth), so a settle sent again after a crash is not counted twice.
Only the LimitsActor writes them while a gateway runs; ``llmgw keys create --rpm ...`` with
no gateway to deliver to writes the new key's row here, and the owner loads it when it
starts (as ``llmgw keys`` writes the key table).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import msgspec

from actors.state.limit_counters import CountersSnapshot
from actors.stores.db import Migration
from schemas.limits import LimitSpec

if TYPE_CHECKING:
    from collections.abc import Sequence

    import aiosqlite

    from actors.state.limit_leases import LeaseSnapshot

LIMITS = Migration(
    "limits",
    (
        "CREATE TABLE IF NOT EXISTS limits ("
        " subject TEXT PRIMARY KEY, spec TEXT NOT NULL, updated REAL NOT NULL)",
        "CREATE TABLE IF NOT EXISTS limit_counters ("
        " subject TEXT PRIMARY KEY, data BLOB NOT NULL, updated REAL NOT NULL)",
        "CREATE TABLE IF NOT EXISTS limit_settled (request_id TEXT PRIMARY KEY, ts REAL NOT NULL)",
    ),
)


@dataclass(slots=True)
class LimitsLoaded:
    """What an owner of the limits starts from: the limits, the counters, the request ids
    whose settles the counters hold, and (where saved) the leases still running."""

    specs: dict[str, LimitSpec]
    counters: dict[str, CountersSnapshot]
    settled: list[tuple[str, float]]
    leases: list[LeaseSnapshot] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class CountersSave:
    """One save of the counters: ``snaps`` of the subjects that changed, the ``settled``
    (request id, time) pairs they hold, ids settled before ``forget_before`` forgotten,
    and the running ``leases`` (None: unchanged, or not kept by this storage)."""

    snaps: dict[str, CountersSnapshot]
    now: float
    settled: Sequence[tuple[str, float]] = ()
    forget_before: float = 0.0
    leases: list[LeaseSnapshot] | None = None


class LimitsStorage(Protocol):
    """Where the LimitsActor keeps its state: :class:`SqliteLimits` (one host) or
    ``limits_snapshot.SnapshotLimits`` (a cluster). ``saves_leases``: the leases are saved
    with the counters, and an admission is answered only once saved (a new owner then holds
    every limit exactly). Every method raises what its storage raises."""

    saves_leases: bool

    async def load(self, settled_since: float) -> LimitsLoaded: ...

    async def save_limit(self, subject: str, spec: LimitSpec | None, now: float) -> None: ...

    async def save_counters(self, batch: CountersSave) -> None: ...

    async def aclose(self) -> None: ...


class SqliteLimits:
    """The limits' tables in the shared SQLite file (leases are not saved: see the actor)."""

    saves_leases = False

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def load(self, settled_since: float) -> LimitsLoaded:
        """The limits, the counters and the ids settled since ``settled_since``."""
        return LimitsLoaded(
            await load_limits(self._db),
            await load_counters(self._db),
            await load_settled(self._db, settled_since),
        )

    async def save_limit(self, subject: str, spec: LimitSpec | None, now: float) -> None:
        """Store (None: delete) ``subject``'s limit."""
        await save_limit(self._db, subject, spec, now)

    async def save_counters(self, batch: CountersSave) -> None:
        """Save the counters with the ids they hold (leases are not kept here)."""
        await save_counters(self._db, batch.snaps, batch.now, batch.settled, batch.forget_before)

    async def aclose(self) -> None:
        """Close the database."""
        await self._db.close()


_spec_decoder = msgspec.json.Decoder(LimitSpec)
_counters_decoder = msgspec.json.Decoder(CountersSnapshot)


async def load_limits(db: aiosqlite.Connection) -> dict[str, LimitSpec]:
    """Every stored limit by subject (a row that no longer decodes is skipped)."""
    out: dict[str, LimitSpec] = {}
    async with db.execute("SELECT subject, spec FROM limits") as cur:
        for subject, spec in await cur.fetchall():
            try:
                out[str(subject)] = _spec_decoder.decode(spec)
            except msgspec.DecodeError:
                continue
    return out


async def save_limit(
    db: aiosqlite.Connection, subject: str, spec: LimitSpec | None, now: float
) -> None:
    """Store (or, with None, delete) ``subject``'s limit and commit."""
    if spec is None:
        await db.execute("DELETE FROM limits WHERE subject = ?", (subject,))
    else:
        await db.execute(
            "INSERT INTO limits (subject, spec, updated) VALUES (?, ?, ?) ON CONFLICT(subject)"
            " DO UPDATE SET spec = excluded.spec, updated = excluded.updated",
            (subject, msgspec.json.encode(spec).decode(), now),
        )
    await db.commit()


async def load_counters(db: aiosqlite.Connection) -> dict[str, CountersSnapshot]:
    """Every subject's last counters snapshot."""
    out: dict[str, CountersSnapshot] = {}
    async with db.execute("SELECT subject, data FROM limit_counters") as cur:
        for subject, data in await cur.fetchall():
            try:
                out[str(subject)] = _counters_decoder.decode(bytes(data))
            except msgspec.DecodeError:
                continue
    return out


async def save_counters(
    db: aiosqlite.Connection,
    snaps: dict[str, CountersSnapshot],
    now: float,
    settled: Sequence[tuple[str, float]] = (),
    forget_before: float = 0.0,
) -> None:
    """Replace the snapshots of ``snaps``' subjects, add the ``settled`` (request id, time)
    pairs counted in them, forget those settled before ``forget_before``, and commit: one
    transaction, so the ids on file are exactly those the counters on file include."""
    await db.executemany(
        "INSERT INTO limit_counters (subject, data, updated) VALUES (?, ?, ?)"
        " ON CONFLICT(subject) DO UPDATE SET data = excluded.data, updated = excluded.updated",
        [(s, msgspec.json.encode(snap), now) for s, snap in snaps.items()],
    )
    await db.executemany("INSERT OR IGNORE INTO limit_settled VALUES (?, ?)", settled)
    await db.execute("DELETE FROM limit_settled WHERE ts < ?", (forget_before,))
    await db.commit()


async def load_settled(db: aiosqlite.Connection, since: float) -> list[tuple[str, float]]:
    """The request ids settled since ``since`` whose counting the snapshots hold, oldest
    first."""
    async with db.execute(
        "SELECT request_id, ts FROM limit_settled WHERE ts >= ? ORDER BY ts", (since,)
    ) as cur:
        return [(str(rid), float(ts)) for rid, ts in await cur.fetchall()]
