"""``llmgw logs`` with no gateway running: read the request log's file directly (read-only).

The StoreActor owns the request log; while a gateway runs, ``llmgw logs`` asks it
(``gateway.cli.logs``). With ``--db``, or when no gateway serves the database on this machine,
the rows are read from the file here, with the owner's own query (WAL lets this read while a
gateway writes). An operator tool, never imported by the ingress: on the documented
allow-list of gateway modules that may import ``actors``
(``tests/unit/gateway/test_ingress_imports.py``).
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

from actors.stores.request_log import TABLE_INFO, LogQuery, as_dicts
from gateway.cli.common import LogFileError

if TYPE_CHECKING:
    from pathlib import Path


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
