"""``openai_compat`` upstreams: OpenAI, vLLM, SGLang, Ollama, OpenRouter-style servers.

The canonical shape *is* this wire shape, so requests pass through with only ``model``
replaced by the route's ``provider_model_id``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import msgspec

from gateway.adapters.base import (
    JSON,
    UpstreamTarget,
    bad_response,
    error_from_status,
    transport_error,
)
from gateway.sse import SSEParser
from schemas import UpstreamError

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_DONE = b"[DONE]"


class OpenAICompatAdapter:
    """Calls ``{base_url}/chat/completions`` and ``/embeddings`` on a pooled httpx client."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    def _request(self, target: UpstreamTarget, path: str, body: JSON) -> httpx.Request:
        payload = dict(body)
        if target.upstream_model:
            payload["model"] = target.upstream_model
        headers = {"content-type": "application/json"}
        if target.api_key:
            headers["authorization"] = f"Bearer {target.api_key}"
        return self._client.build_request(
            "POST",
            target.base_url.rstrip("/") + path,
            content=_encode(payload),
            headers=headers,
            timeout=httpx.Timeout(target.timeout, connect=target.connect_timeout),
        )

    async def _post_json(self, target: UpstreamTarget, path: str, body: JSON, key: str) -> JSON:
        try:
            resp = await self._client.send(self._request(target, path, body))
        except httpx.HTTPError as exc:
            raise transport_error(target.endpoint, exc) from None
        raw = resp.content
        if resp.status_code >= 300:
            raise error_from_status(target.endpoint, resp, raw)
        try:
            data = _decode(raw)
        except msgspec.DecodeError:
            raise bad_response(target.endpoint, "the body is not JSON") from None
        if not isinstance(data, dict) or key not in data:
            raise bad_response(target.endpoint, f"the JSON has no {key!r}")
        return data

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        """POST /chat/completions. Raises UpstreamError."""
        return await self._post_json(target, "/chat/completions", body, "choices")

    async def embed(self, target: UpstreamTarget, body: JSON) -> JSON:
        """POST /embeddings. Raises UpstreamError."""
        return await self._post_json(target, "/embeddings", body, "data")

    async def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[JSON]:
        """POST /chat/completions with stream; yields chunk dicts until ``[DONE]``.

        Raises UpstreamError on a non-2xx answer, a broken connection, an in-band error, or
        a stream that ends without ``[DONE]`` (a silent truncation is never a success).
        """
        try:
            resp = await self._client.send(self._request(target, "/chat/completions", body),
                                           stream=True)
        except httpx.HTTPError as exc:
            raise transport_error(target.endpoint, exc) from None
        try:
            if resp.status_code >= 300:
                raise error_from_status(target.endpoint, resp, await resp.aread())
            parser = SSEParser()
            async for raw in resp.aiter_raw():
                for _event, data in parser.feed(raw):
                    if data == _DONE:
                        return
                    try:
                        chunk = _decode(data)
                    except msgspec.DecodeError:
                        raise bad_response(target.endpoint, "a stream event is not JSON") from None
                    if not isinstance(chunk, dict):
                        raise bad_response(target.endpoint, "a stream event is not an object")
                    if "error" in chunk:
                        err = chunk["error"]
                        msg = err.get("message") if isinstance(err, dict) else str(err)
                        raise UpstreamError(f"upstream stream error: {msg}",
                                            endpoint=target.endpoint, kind="stream_error")
                    yield chunk
            raise UpstreamError("upstream stream ended before [DONE]", endpoint=target.endpoint,
                                kind="truncated")
        except httpx.HTTPError as exc:
            raise transport_error(target.endpoint, exc) from None
        finally:
            await resp.aclose()
