"""The LimitsActor's tables in the shared SQLite file: the limits, and its counters' snapshots.

``limits`` holds one row per subject (its ``LimitSpec`` as JSON); ``limit_counters`` one
snapshot per subject; ``limit_settled`` the request ids whose settles those snapshots include
(the last ten minutes' worth), so a settle sent again after a crash is not counted twice.
Only the LimitsActor writes them while a gateway runs; ``llmgw keys create --rpm ...`` with
no gateway to deliver to writes the new key's row here, and the owner loads it when it
starts (as ``llmgw keys`` writes the key table).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from actors.state.limit_counters import CountersSnapshot
from actors.stores.db import Migration
from schemas.limits import LimitSpec

if TYPE_CHECKING:
    from collections.abc import Sequence

    import aiosqlite

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
