"""The ingress's short-lived grants of database-added provider keys' secrets, by credential id.

Plans name credentials by id only; configured secrets come from the config file. A key added
through the admin API belongs to the KeyRegistryActor, and the ingress never opens its table:
when a plan names an id this ingress holds no live grant for, it asks the registry for that one
id's secret (``llmgw.keys.registry.secret``: ProviderSecretRequest -> ProviderSecretGrant).
The grant holds for the registry's ``ttl_seconds``; then the next plan naming the id asks
again (an owner that does not answer then leaves the last grant in use, and says so). A
``KeyDeclarations`` announcement drops the grants of keys it no longer declares, so a deleted
key's secret leaves the ingress at once. An id the registry does not hold is remembered until
the next announcement, so it never costs a bus request per request.

Why a grant rather than the secrets on an admin-only subject: the ingress needs a secret only
for a key a plan actually names, and asks for exactly that one; the subject is one NATS lets
only ingress and actors credentials use (operators' admin credentials cannot), and the answer
travels on the asker's inbox, never on a subject anyone subscribes to by pattern.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from gateway.auth.gate import follow, unfollow
from schemas import (
    GatewayError,
    KeyDeclarations,
    ProviderSecretGrant,
    ProviderSecretRequest,
    RouteNotFoundError,
    RoutePlan,
    raise_for_reply,
    subjects,
)

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Iterable

    from bus import Bus
    from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)

_ASK_TIMEOUT_S = 2.0


def configured_credentials(config: GatewayConfig) -> set[str]:
    """The credential ids ``config`` holds the secrets of (never asked for)."""
    return {c for m in config.models for r in m.route for c in r.credential_ids}


class ProviderSecrets:
    """Owns this ingress's grants of database keys' secrets; the Targets read them through
    :meth:`get`. Raises nothing from :meth:`ensure`: a key it cannot resolve is left to the
    dispatcher, which calls the upstream without a key (the upstream refuses it)."""

    def __init__(
        self, bus: Bus, configured: Iterable[str], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._bus = bus
        self._clock = clock
        self._configured = frozenset(configured)
        self._grants: dict[str, tuple[str, float]] = {}  # id -> (secret, valid until)
        self._not_in_db: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def reconfigure(self, configured: Iterable[str]) -> None:
        """The credential ids a reloaded config declares (resolved from it, not the registry)."""
        self._configured = frozenset(configured)
        self._not_in_db.clear()

    def get(self, cid: str) -> str | None:
        """The granted secret of credential ``cid`` (None: no grant here)."""
        grant = self._grants.get(cid)
        return grant[0] if grant is not None else None

    async def start(self) -> None:
        """Follow the registry's announcements."""
        self._task = await follow(
            self._bus, subjects.KEYS_DECLARATIONS, self._on_event, name="provider-secrets"
        )

    async def aclose(self) -> None:
        """Stop following announcements and forget every grant."""
        task, self._task = self._task, None
        await unfollow(task)
        self._grants.clear()

    async def ensure(self, plan: RoutePlan) -> None:
        """Make sure every database credential ``plan`` names (spare keys included) holds a
        live grant here."""
        for c in plan.candidates:
            await self.ensure_credential(c.credential_id)
            for spare in c.spare_credentials:
                await self.ensure_credential(spare)

    async def ensure_credential(self, cid: str) -> None:
        """Make sure credential ``cid`` (a database one; others are skipped) holds a live
        grant here."""
        if not cid or cid in self._configured or cid in self._not_in_db:
            return
        grant = self._grants.get(cid)
        if grant is None or grant[1] <= self._clock():
            await self._ask(cid)

    async def _ask(self, cid: str) -> None:
        try:
            grant = raise_for_reply(
                await self._bus.request(
                    subjects.KEYS_SECRET_GRANT,
                    ProviderSecretRequest(credential_id=cid),
                    reply_type=ProviderSecretGrant,
                    timeout=_ASK_TIMEOUT_S,
                )
            )
        except RouteNotFoundError:
            self._not_in_db.add(cid)
            self._grants.pop(cid, None)
            return
        except GatewayError as err:
            logger.error("no secret granted for credential %s: %s", cid, err.message)
            return
        self._grants[cid] = (grant.secret, self._clock() + grant.ttl_seconds)

    async def _on_event(self, msg: object) -> None:
        if isinstance(msg, KeyDeclarations):
            self._not_in_db.clear()
            declared = {d.credential_id for d in msg.db_keys}
            for cid in [c for c in self._grants if c not in declared]:
                del self._grants[cid]
