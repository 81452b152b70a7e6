"""``llmgw logs`` and ``llmgw admin spend report`` with no gateway running: read the request
log where it is kept (read-only).

The StoreActor owns the request log; while a gateway runs, ``llmgw logs`` asks it
(``gateway.cli.logs``). With ``--db``, or when no gateway serves the database on this machine,
the rows are read here with the owner's own query: from the SQLite file (WAL lets this read
while a gateway writes), or from PostgreSQL when the config names ``database.url``. An
operator tool, never imported by the ingress: on the documented allow-list of gateway modules
that may import ``actors`` (``tests/unit/gateway/ingress/test_ingress_imports.py``).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import TYPE_CHECKING, Any

from actors.admin import refuse_undeclared
from actors.stores.request_log import TABLE_INFO, LogQuery, Row, as_dicts
from actors.stores.spend_report import SPEND_ARGS, SpendQuery
from gateway.cli.common import LogFileError

if TYPE_CHECKING:
    from pathlib import Path

    from schemas.config import DatabaseConfig


def read_rows(path: Path, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows ``arguments`` (the ``log query`` admin command's) select from the file at
    ``path``, oldest first. Raises ValueError for a bad argument, LogFileError."""
    query = LogQuery.from_args(arguments)
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            try:
                # an older file may lack the newer columns: read them as their defaults
                present = {str(r[0]) for r in db.execute(TABLE_INFO)}
                if not present:
                    return []  # the gateway has not logged anything yet
                sql, params = query.sql(present)
                rows = [tuple(r) for r in db.execute(sql, params)]
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return []  # the gateway has not logged anything yet
                raise
    except sqlite3.Error as exc:
        raise LogFileError(str(exc)) from None
    return as_dicts(rows)


def read_rows_postgres(url: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    """As :func:`read_rows`, from the PostgreSQL database at ``url`` (``database.url``).
    Raises ValueError for a bad argument, LogFileError (naming no password)."""
    query = LogQuery.from_args(arguments)
    return as_dicts(asyncio.run(_select_postgres(url, [query.sql()])))


def spend_report(database: DatabaseConfig, arguments: dict[str, Any]) -> dict[str, Any]:
    """The ``spend report`` the owner would answer for ``arguments``, read from PostgreSQL
    (``database.url``) or else the SQLite file. Raises ValueError for a bad argument,
    LogFileError."""
    # The owner's AdminArea refuses what a report does not take; so does its stand-in.
    refuse_undeclared("spend", "report", arguments, SPEND_ARGS)
    query = SpendQuery.from_args(arguments, time.time())
    if database.url:
        return query.result(asyncio.run(_select_postgres(database.url, query.queries())))
    rows: list[Row] = []
    try:
        with sqlite3.connect(f"file:{database.path}?mode=ro", uri=True) as db:
            for sql, params in query.queries():
                rows += [tuple(r) for r in db.execute(sql, params)]
    except sqlite3.Error as exc:
        raise LogFileError(str(exc)) from None
    return query.result(rows)


async def _select_postgres(url: str, selects: list[tuple[str, list[Any]]]) -> list[Row]:
    """The rows of every SELECT (``?`` placeholders) in one read-only transaction."""
    # Imported here only: asyncpg is an optional extra, needed where PostgreSQL is configured.
    import asyncpg

    from actors.stores.log_postgres import DRIVER_ERRORS, display_url, plain
    from actors.stores.log_storage import numbered

    try:
        con = await asyncpg.connect(url, timeout=10)
        try:
            async with con.transaction(readonly=True):
                return [
                    plain(r)
                    for sql, params in selects
                    for r in await con.fetch(numbered(sql), *params)
                ]
        finally:
            await con.close()
    except asyncpg.UndefinedTableError:
        return []  # the gateway has not logged anything yet
    except DRIVER_ERRORS as exc:
        raise LogFileError(f"{display_url(url)}: {type(exc).__name__}: {exc}") from None
