"""Which adapter serves which upstream ``kind``, and the pooled HTTP client they share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.adapters.anthropic import AnthropicAdapter
from gateway.adapters.azure_openai import AzureOpenAIAdapter
from gateway.adapters.base import RedactingAdapter
from gateway.adapters.bedrock import BedrockAdapter
from gateway.adapters.echo import EchoAdapter
from gateway.adapters.gemini import GeminiAdapter
from gateway.adapters.openai_compat import OpenAICompatAdapter
from gateway.adapters.upstream_http import UpstreamHTTP
from schemas.process_config import MAX_UPSTREAM_ANSWER_BYTES

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gateway.adapters.base import Adapter
    from schemas.config import GatewayConfig


def make_http_client(max_answer_bytes: int = MAX_UPSTREAM_ANSWER_BYTES) -> UpstreamHTTP:
    """The pooled upstream client (our own HTTP/1.1; adapters/upstream_http.py says why),
    a whole answer's body bounded by ``max_answer_bytes`` (``server.max_upstream_answer_bytes``)."""
    return UpstreamHTTP(limit=1000, keepalive_seconds=30.0, max_answer_bytes=max_answer_bytes)


def make_adapters(http: UpstreamHTTP) -> dict[str, Adapter]:
    """One adapter per upstream kind, all on ``upstream_http``, each redacting what its
    upstream says of the credential it was sent (see ``base.RedactingAdapter``)."""
    kinds: dict[str, Adapter] = {
        "echo": EchoAdapter(),
        "openai_compat": OpenAICompatAdapter(http),
        "anthropic": AnthropicAdapter(http),
        "azure_openai": AzureOpenAIAdapter(http),
        "gemini": GeminiAdapter(http),
        "bedrock": BedrockAdapter(http),
    }
    return {kind: RedactingAdapter(adapter) for kind, adapter in kinds.items()}


class Upstreams:
    """Owns the adapter of each upstream kind and the pooled client they share: opened at
    start, closed at aclose. ``own`` adapters (the replay's simulated upstreams) serve in
    place of the HTTP ones, and then no client is opened. ``max_answer_bytes``: the bound on a
    whole upstream answer's body (``server.max_upstream_answer_bytes``)."""

    def __init__(
        self,
        own: Mapping[str, Adapter] | None = None,
        *,
        max_answer_bytes: int = MAX_UPSTREAM_ANSWER_BYTES,
    ) -> None:
        self.adapters: dict[str, Adapter] = {"echo": EchoAdapter(), **(own or {})}
        self._own = own is not None
        self._client: UpstreamHTTP | None = None
        self._max_answer_bytes = max_answer_bytes

    async def start(self) -> None:
        """Open the pooled client and fill in the HTTP adapters (unless ``own`` serve)."""
        if self._client is None and not self._own:
            self._client = make_http_client(self._max_answer_bytes)
            self.adapters.update(make_adapters(self._client))

    def reconfigure(self, config: GatewayConfig) -> None:
        """Follow ``server.max_upstream_answer_bytes`` from the next request on."""
        self._max_answer_bytes = config.server.max_upstream_answer_bytes
        if self._client is not None:
            self._client.max_answer_bytes = self._max_answer_bytes

    async def aclose(self) -> None:
        """Close the pooled client (connections in flight end)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
