"""The ingress's side of callers and credentials, in one object the app holds.

``Callers`` owns the ingress's views of callers and credentials, each fed by its owner actor
over the bus (never by the actors' database): the auth gate and its key cache (the
ApiKeyAdminActor's keys), the grants of database keys' secrets (the KeyRegistryActor's), and
the admin handlers for both. The app calls ``auth.gate`` before every handler, the target
resolution ``secrets.ensure`` on every plan, and ``details`` serves the admin-only parts of
``/routing`` and ``/health/deep`` (base URLs and credential ids; other callers see endpoint
ids and states).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gateway.auth.gate import Authenticator, caller_of
from gateway.auth.provider_secrets import ProviderSecrets, configured_credentials
from schemas import GatewayError, KeyPoolState, KeyPoolStateRequest, subjects

if TYPE_CHECKING:
    from bus import Bus
    from gateway.http.request import HttpRequest
    from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)


class Callers:
    """Owns the ingress's auth cache and provider-secret grants."""

    def __init__(self, bus: Bus, config: GatewayConfig) -> None:
        self._bus = bus
        self.auth = Authenticator(bus, config)
        self.secrets = ProviderSecrets(bus, configured_credentials(config))
        self._base_urls = _base_urls(config)

    def reconfigure(self, config: GatewayConfig) -> None:
        """Follow a reloaded config: auth settings, configured credentials, base URLs."""
        self.auth.reconfigure(config)
        self.secrets.reconfigure(configured_credentials(config))
        self._base_urls = _base_urls(config)

    async def start(self) -> None:
        """Learn the auth mode, follow key and declaration events."""
        await self.auth.start()
        await self.secrets.start()

    async def aclose(self) -> None:
        """Stop following events; forget the grants."""
        await self.secrets.aclose()
        await self.auth.aclose()

    async def details(self, req: HttpRequest, endpoint: str) -> dict[str, Any]:
        """For an admin caller: ``endpoint``'s base URL and its pool's credentials (ids,
        tiers, mutes, cooling after a 429); ``{}`` for anyone else."""
        if not caller_of(req).is_admin:
            return {}
        out: dict[str, Any] = {"base_url": self._base_urls.get(endpoint, "")}
        try:
            st = await self._bus.request(
                subjects.keypool_get(endpoint),
                KeyPoolStateRequest(),
                reply_type=KeyPoolState,
                timeout=1.0,
            )
        except GatewayError:
            return out
        if isinstance(st, KeyPoolState):
            out["credentials"] = [
                {
                    "credential_id": k.credential_id,
                    "min_role": k.min_role,
                    "muted_until": k.muted_until,
                    "cooling_until": st.cooling.get(k.credential_id),
                    "source": k.source,
                }
                for k in st.keys
            ]
        return out


def _base_urls(config: GatewayConfig) -> dict[str, str]:
    return {
        eid: r.base_url
        for m in config.models
        for eid, r in zip(m.endpoint_ids(), m.route, strict=True)
    }
