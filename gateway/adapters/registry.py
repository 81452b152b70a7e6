"""Which adapter serves which upstream ``kind``, and the pooled HTTP client they share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.adapters.anthropic import AnthropicAdapter
from gateway.adapters.bedrock import BedrockAdapter
from gateway.adapters.echo import EchoAdapter
from gateway.adapters.openai_compat import OpenAICompatAdapter
from gateway.adapters.redaction import RedactingAdapter
from gateway.adapters.upstream_http import UpstreamHTTP

if TYPE_CHECKING:
    from gateway.adapters.base import Adapter


def make_http_client() -> UpstreamHTTP:
    """The pooled upstream client (aiohttp; see gateway/adapters/upstream_http.py for why)."""
    return UpstreamHTTP(limit=1000, keepalive_seconds=30.0)


def make_adapters(http: UpstreamHTTP) -> dict[str, Adapter]:
    """One adapter per upstream kind, all on ``upstream_http``, each redacting what its
    upstream says of the credential it was sent (see ``redaction``)."""
    kinds: dict[str, Adapter] = {
        "echo": EchoAdapter(),
        "openai_compat": OpenAICompatAdapter(http),
        "anthropic": AnthropicAdapter(http),
        "bedrock": BedrockAdapter(http),
    }
    return {kind: RedactingAdapter(adapter) for kind, adapter in kinds.items()}
