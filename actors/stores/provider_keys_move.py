"""Moving a host's provider keys from its SQLite file into the cluster's PostgreSQL.

A deployment that grows from one actors host into a cluster sets ``database.url``; the
provider keys an operator added through the admin API until then, and the reservations of
configured keys, are in that host's SQLite file (``database.path``), which no other host
reads: a takeover of the ``keys`` unit would lose them. So an actors host of a cluster, before
it joins, copies the keys and reservations of its own file into PostgreSQL where PostgreSQL
has no row of that key id or credential id (a row already there is the cluster's newer word),
and then removes them from the file, so a key deleted later in the cluster cannot come back
from it. The copy changes nothing when repeated, so a host that died between the two steps
finishes the move when it next starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from actors.stores.provider_keys import PROVIDER_KEYS, LazyDb, ProviderKeyStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MovedKeys:
    """What one move took from the file: key ids and reserved credential ids."""

    key_ids: tuple[str, ...]
    reservations: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.key_ids or self.reservations)


async def move_provider_keys(db_path: str, url: str) -> MovedKeys:
    """Move the provider keys and reservations of the SQLite file at ``db_path`` into the
    PostgreSQL database at ``url`` (see the module's docstring); logs what moved, never a
    secret. A missing file moves nothing and is not created. Raises SharedDatabaseError when
    PostgreSQL fails (the file keeps everything then) and sqlite3.Error when the file does."""
    # Imported here only: asyncpg is needed by deployments that configure PostgreSQL.
    from actors.stores.provider_keys_postgres import PostgresProviderKeyStore

    local = ProviderKeyStore(LazyDb(db_path, [PROVIDER_KEYS]))
    shared = PostgresProviderKeyStore(url)
    try:
        keys, reservations = await local.rows()
        if not keys and not reservations:
            return MovedKeys((), ())
        await shared.adopt(keys, reservations)
        moved = MovedKeys(tuple(str(k[0]) for k in keys), tuple(str(r[0]) for r in reservations))
        await local.forget(moved.key_ids, moved.reservations)
    finally:
        await local.aclose()
        await shared.aclose()
    logger.warning(
        "moved %d provider keys (%s) and %d reservations from the SQLite file %s into the"
        " cluster's PostgreSQL database: the keys unit reads them there on any host",
        len(moved.key_ids),
        ", ".join(moved.key_ids) or "none",
        len(moved.reservations),
        db_path,
    )
    return moved
