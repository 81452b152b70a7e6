"""The ingress's copy of database-added provider keys' secrets, by credential id.

Plans name credentials by id only; configured secrets come from the config file, and keys
added through the admin API are read from the shared database (every process of a deployment
uses the same file) into ``gateway.dispatch.RUNTIME_SECRETS``, where the Targets find them.
The copy is reloaded when the key registry announces new declarations
(``llmgw.keys.registry.declarations``), and whenever a plan names an id this ingress does not
know (a declaration that outran the announcement); an id the database does not hold either
is remembered until the next announcement, so it never costs a query per request.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Iterable

from actors.keystore import ProviderKeyStore
from bus import Bus
from gateway.auth import follow, unfollow
from gateway.dispatch import RUNTIME_SECRETS
from schemas import RoutePlan, subjects

logger = logging.getLogger(__name__)


class ProviderSecrets:
    """Fills ``RUNTIME_SECRETS`` with the database keys' secrets and keeps it current."""

    def __init__(self, bus: Bus, store: ProviderKeyStore, configured: Iterable[str]) -> None:
        self._bus = bus
        self._store = store
        self._configured = frozenset(configured)
        self._not_in_db: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def reconfigure(self, configured: Iterable[str]) -> None:
        """The credential ids a reloaded config declares (resolved from it, not the database)."""
        self._configured = frozenset(configured)
        self._not_in_db.clear()

    async def start(self) -> None:
        """Load the secrets and follow the registry's announcements."""
        await self.reload()
        self._task = await follow(self._bus, subjects.KEYS_DECLARATIONS, self._on_event,
                                  name="provider-secrets")

    async def aclose(self) -> None:
        """Stop following announcements."""
        task, self._task = self._task, None
        await unfollow(task)

    async def reload(self) -> None:
        """Re-read every database key's secret (a failure keeps the last copy)."""
        self._not_in_db.clear()
        try:
            fresh = await self._store.secrets()
        except sqlite3.Error as exc:
            logger.error("provider key secrets not reloaded: %s", exc)
            return
        # Only ever added to: an id is its secret's hash, so an entry is never wrong, and a
        # deleted key is simply never planned again.
        RUNTIME_SECRETS.update(fresh)

    async def ensure(self, plan: RoutePlan) -> None:
        """Make sure every credential ``plan`` names can be resolved here."""
        for c in plan.candidates:
            cid = c.credential_id
            if (cid and cid not in self._configured and cid not in RUNTIME_SECRETS
                    and cid not in self._not_in_db):
                await self.reload()
                if cid not in RUNTIME_SECRETS:
                    self._not_in_db.add(cid)

    async def _on_event(self, msg: object) -> None:
        await self.reload()
