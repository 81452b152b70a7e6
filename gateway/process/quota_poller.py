"""The quota poller: reads every ``http_json`` quota source and tells its pool's owner.

A sidecar beside the actors (actors do no upstream I/O; see gateway/process/sidecars.py). Every
``refresh_seconds`` it GETs the source's URL with the route's credential (``Authorization:
Bearer``), reads ``used`` and ``limit`` at their dotted paths (``data.used``, ``items.0.n``)
and publishes a ``QuotaReading``; when it cannot (unreachable, an HTTP error, not JSON, a
path that is missing or not a number) the reading carries the reason instead. Reasons name
the URL's host and path, never its query or the credential.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec

from schemas import GatewayError, QuotaReading, UpstreamError, subjects
from schemas.capacity import PoolSpec, capacity_pools
from schemas.config import GatewayConfig, HttpJsonQuotaSource

if TYPE_CHECKING:
    from bus import Bus
    from gateway.adapters.upstream_http import UpstreamHTTP

logger = logging.getLogger(__name__)


class SourceError(Exception):
    """A quota source's answer could not be read; the message says why."""


def read_path(doc: Any, path: str, name: str) -> float:
    """The number at dotted ``path`` of ``doc``. Raises SourceError naming ``name`` (the
    config key) and the path when it is missing or not a number."""
    node = doc
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise SourceError(f"{name} {path!r} not found in the answer")
    if isinstance(node, bool) or not isinstance(node, int | float):
        raise SourceError(f"{name} {path!r} is not a number")
    return float(node)


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.netloc}{parts.path}"


class QuotaPoller:
    """Polls the http_json sources of the pools of the config it was last given (one task
    per pool) until :meth:`aclose`. A reload (:meth:`reconfigure`) starts polling the pools
    it adds, restarts the ones whose source or credential changed (polled at once with the
    new declaration) and stops the ones it removed."""

    def __init__(self, bus: Bus, client: UpstreamHTTP, config: GatewayConfig | None = None) -> None:
        self._bus = bus
        self._client = client
        self._polling: dict[str, tuple[tuple[PoolSpec, str | None], asyncio.Task[None]]] = {}
        if config is not None:
            self.reconfigure(config)

    @property
    def pools(self) -> list[PoolSpec]:
        """The pools with an http_json source being polled."""
        return [spec for (spec, _), _task in self._polling.values()]

    def reconfigure(self, config: GatewayConfig, *, polling: bool = True) -> None:
        """Poll the http_json sources of ``config`` from now on (see the class docstring);
        none while ``polling`` is false (in a cluster, another host owns the pools)."""
        wanted = {
            p.pool: (p, _credential(config, p.endpoints[0]))
            for p in capacity_pools(config).values()
            if polling and isinstance(p.source, HttpJsonQuotaSource)
        }
        for name, (key, task) in list(self._polling.items()):
            if wanted.get(name) != key:
                task.cancel()
                del self._polling[name]
        for name, key in wanted.items():
            if name not in self._polling:
                task = asyncio.create_task(self._poll_forever(*key), name=f"quota-poll:{name}")
                self._polling[name] = (key, task)

    async def aclose(self) -> None:
        """Stop polling."""
        tasks = [task for _, task in self._polling.values()]
        self._polling.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _poll_forever(self, pool: PoolSpec, secret: str | None) -> None:
        assert isinstance(pool.source, HttpJsonQuotaSource)
        while True:
            await self.poll_once(pool, secret)
            await asyncio.sleep(pool.source.refresh_seconds)

    async def poll_once(self, pool: PoolSpec, secret: str | None) -> QuotaReading:
        """Read ``pool``'s source once with ``secret`` (its first route's credential) and
        publish what was read (or why nothing was)."""
        source = pool.source
        assert isinstance(source, HttpJsonQuotaSource)
        try:
            used, limit = await self._read(pool.endpoints[0], source, secret)
            reading = QuotaReading(pool=pool.pool, used=used, limit=limit)
        except SourceError as exc:
            reading = QuotaReading(pool=pool.pool, error=f"{_where(source.url)}: {exc}")
        try:
            await self._bus.publish(subjects.capacity_reading(pool.pool), reading)
        except GatewayError as exc:
            logger.warning("quota reading of %s not published: %s", pool.pool, exc)
        return reading

    async def _read(
        self, endpoint: str, source: HttpJsonQuotaSource, secret: str | None
    ) -> tuple[float, float | None]:
        headers = {"accept": "application/json"}
        if secret:
            headers["authorization"] = f"Bearer {secret}"
        try:
            answer = await self._client.get(
                endpoint, source.url, headers, timeout=min(source.refresh_seconds, 30.0)
            )
        except UpstreamError as exc:
            raise SourceError(f"unreachable ({exc.kind})") from None
        if answer.status >= 400:
            raise SourceError(f"HTTP {answer.status}")
        try:
            doc = msgspec.json.decode(answer.body)
        except msgspec.DecodeError:
            raise SourceError("the answer is not JSON") from None
        used = read_path(doc, source.used_path, "used_path")
        limit = (
            None if source.limit_path is None else read_path(doc, source.limit_path, "limit_path")
        )
        return used, limit


def _credential(config: GatewayConfig, endpoint: str) -> str | None:
    """The first credential of route ``endpoint`` (None: it has none)."""
    for model in config.models:
        for eid, route in zip(model.endpoint_ids(), model.route, strict=True):
            if eid == endpoint:
                return route.secrets[0] if route.secrets else None
    return None
