"""The request log's databases as the StoreActor's contract suite sees them: the SQLite file
and PostgreSQL, each read and altered from outside the owner the way an operator would."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg

if TYPE_CHECKING:
    from schemas.config import DatabaseConfig


@dataclass(frozen=True, slots=True)
class LogDatabase:
    """One backend: ``config`` names it to the StoreActor."""

    kind: str  # "sqlite" or "postgres"
    config: DatabaseConfig

    async def rows(self, where: str = "") -> list[dict[str, Any]]:
        """``request_log``'s rows (``where``: a clause), in insertion order, as dicts."""
        return [dict(r) for r in await self.fetch(f"SELECT * FROM request_log {where} ORDER BY id")]

    async def fetch(self, sql: str) -> list[dict[str, Any]]:
        """The rows of ``sql`` (no parameters), on a connection of its own."""
        if self.config.url is None:
            with sqlite3.connect(self.config.path) as db:
                db.row_factory = sqlite3.Row
                return [dict(r) for r in db.execute(sql)]
        con = await asyncpg.connect(self.config.url)
        try:
            return [dict(r) for r in await con.fetch(sql)]
        finally:
            await con.close()

    async def execute(self, sql: str) -> None:
        """Run one statement (committed) on a connection of its own."""
        if self.config.url is None:
            with sqlite3.connect(self.config.path) as db:
                db.execute(sql)
            return
        con = await asyncpg.connect(self.config.url)
        try:
            await con.execute(sql)
        finally:
            await con.close()
