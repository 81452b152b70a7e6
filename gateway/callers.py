"""The ingress's side of callers and credentials, in one object the app holds.

``Callers`` owns the ingress's database connection (gateway API keys and database-added
provider keys, one lazily opened SQLite connection), the auth gate, the copy of database key
secrets, and the admin handlers for both. The app calls ``gate`` before every handler,
``secrets.ensure`` on every plan, and ``details`` for the admin-only parts of ``/routing`` and
``/health/deep`` (base URLs and credential ids; other callers see endpoint ids and states).
"""

from __future__ import annotations

import logging
from typing import Any

from actors.apikeys import API_KEYS, ApiKeyStore
from actors.keystore import PROVIDER_KEYS, LazyDb, ProviderKeyStore
from bus import Bus
from gateway.admin_keys import AdminKeys, Handler
from gateway.auth import Authenticator, caller_of
from gateway.http import HttpRequest
from gateway.provider_secrets import ProviderSecrets
from schemas import GatewayError, KeyPoolState, KeyPoolStateRequest, subjects
from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)


class Callers:
    """Owns the ingress's key stores, auth cache and provider-secret copy."""

    def __init__(self, bus: Bus, config: GatewayConfig) -> None:
        self._bus = bus
        self._db = LazyDb(config.database.path, [API_KEYS, PROVIDER_KEYS])
        api_keys = ApiKeyStore(self._db)
        provider = ProviderKeyStore(self._db)
        self.auth = Authenticator(bus, config, api_keys)
        self.secrets = ProviderSecrets(bus, provider, _configured_ids(config))
        self.admin = AdminKeys(bus, self.auth)
        self._base_urls = _base_urls(config)

    def reconfigure(self, config: GatewayConfig) -> None:
        """Follow a reloaded config: auth settings, configured credentials, base URLs. (The
        database path is read at startup only.)"""
        self.auth.reconfigure(config)
        self.secrets.reconfigure(_configured_ids(config))
        self._base_urls = _base_urls(config)

    def routes(self) -> dict[tuple[str, str], Handler]:
        """Exact admin routes."""
        return self.admin.routes()

    def prefix_routes(self) -> dict[tuple[str, str], Handler]:
        """Admin routes carrying an id (they must be tried before any ``/admin/`` catch-all)."""
        return self.admin.prefix_routes()

    async def start(self) -> None:
        """Learn the auth mode, load secrets, follow key events."""
        await self.auth.start()
        await self.secrets.start()

    async def aclose(self) -> None:
        """Stop following events and close the database."""
        await self.secrets.aclose()
        await self.auth.aclose()
        await self._db.aclose()

    async def gate(self, req: HttpRequest) -> None:
        """Identify and admit ``req``'s caller. Raises UnauthorizedError, ForbiddenError."""
        await self.auth.gate(req)

    async def details(self, req: HttpRequest, endpoint: str) -> dict[str, Any]:
        """For an admin caller: ``endpoint``'s base URL and its pool's credentials (ids,
        tiers, mutes); ``{}`` for anyone else."""
        if not caller_of(req).is_admin:
            return {}
        out: dict[str, Any] = {"base_url": self._base_urls.get(endpoint, "")}
        try:
            st = await self._bus.request(subjects.keypool_get(endpoint), KeyPoolStateRequest(),
                                         reply_type=KeyPoolState, timeout=1.0)
        except GatewayError:
            return out
        if isinstance(st, KeyPoolState):
            out["credentials"] = [{"credential_id": k.credential_id, "min_role": k.min_role,
                                   "muted_until": k.muted_until, "source": k.source}
                                  for k in st.keys]
        return out


def _configured_ids(config: GatewayConfig) -> set[str]:
    return {c for m in config.models for r in m.route for c in r.credential_ids}


def _base_urls(config: GatewayConfig) -> dict[str, str]:
    return {eid: r.base_url for m in config.models
            for eid, r in zip(m.endpoint_ids(), m.route, strict=True)}
