"""Which adapter serves which upstream ``kind``, and the pooled HTTP client they share."""

from __future__ import annotations

import httpx

from gateway.adapters.anthropic import AnthropicAdapter
from gateway.adapters.base import Adapter
from gateway.adapters.echo import EchoAdapter
from gateway.adapters.openai_compat import OpenAICompatAdapter


def make_http_client() -> httpx.AsyncClient:
    """The pooled upstream client: httpx's API over aiohttp's engine (see DESIGN.md)."""
    from httpx_aiohttp import AiohttpTransport

    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200,
                          keepalive_expiry=30.0)
    return httpx.AsyncClient(transport=AiohttpTransport(limits=limits), timeout=None)


def make_adapters(client: httpx.AsyncClient) -> dict[str, Adapter]:
    """One adapter per upstream kind, all on ``client``."""
    return {
        "echo": EchoAdapter(),
        "openai_compat": OpenAICompatAdapter(client),
        "anthropic": AnthropicAdapter(client),
    }
