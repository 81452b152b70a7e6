"""A request log file from before the cost columns: ``llmgw logs`` reads it with their
defaults, and the StoreActor adds them at start, keeping the old rows."""

from __future__ import annotations

import sqlite3
import time
from typing import TYPE_CHECKING

import anyio

from actors import StoreActor
from actors.stores.request_log import ADDED_COLUMNS
from gateway.cli.logs_offline import read_rows
from schemas import RequestCompleted
from schemas.config import LogConfig
from tests.unit.actors import log

if TYPE_CHECKING:
    from pathlib import Path

    from bus import InProcessBus

_OLD = (
    "CREATE TABLE request_log (id INTEGER PRIMARY KEY, ts REAL NOT NULL, kind TEXT NOT NULL,"
    " request_id TEXT NOT NULL, caller_id TEXT NOT NULL, org TEXT NOT NULL,"
    " surface TEXT NOT NULL, requested_model TEXT NOT NULL, model TEXT NOT NULL,"
    " endpoint TEXT NOT NULL, credential_id TEXT NOT NULL, status INTEGER,"
    " outcome TEXT NOT NULL, error_kind TEXT NOT NULL, fallback INTEGER NOT NULL,"
    " attempt INTEGER NOT NULL, ttft_ms REAL, latency_ms REAL NOT NULL,"
    " prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,"
    " cached_tokens INTEGER NOT NULL, stream INTEGER NOT NULL)"
)


def _old_file(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute(_OLD)
        db.execute(
            "INSERT INTO request_log VALUES (1, ?, 'request', 'old', '', '', 'chat', 'm',"
            " 'm', 'm:a', '', 200, 'success', '', 0, 1, NULL, 1.0, 3, 4, 0, 0)",
            (time.time(),),
        )


async def test_an_old_log_is_read_with_defaults_then_upgraded_in_place(
    bus: InProcessBus,
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.db"
    _old_file(path)
    (old,) = read_rows(path, {})
    assert (old["request_id"], old["cost_usd"], old["cost_estimated"]) == ("old", 0.0, False)

    store = StoreActor(str(path), LogConfig(flush_ms=10_000))
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        await log(
            bus,
            RequestCompleted(
                request_id="new",
                model="m",
                cost_usd=0.25,
                key_id="gk-1",
                org="acme",
                user="alice",
                ts=time.time(),
            ),
        )
        store.request_stop()
    with sqlite3.connect(path) as db:
        columns = {r[1] for r in db.execute("PRAGMA table_info(request_log)")}
    assert set(ADDED_COLUMNS) <= columns
    rows = {r["request_id"]: r for r in read_rows(path, {})}
    assert rows["old"]["cost_usd"] == 0.0
    assert (rows["new"]["cost_usd"], rows["new"]["key_id"], rows["new"]["user_id"]) == (
        0.25,
        "gk-1",
        "acme/alice",
    )
