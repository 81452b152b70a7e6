"""``openai_compat`` upstreams: OpenAI, vLLM, SGLang, Ollama, OpenRouter-style servers.

The canonical shape *is* this wire shape, so requests pass through with only ``model``
replaced by the route's ``provider_model_id``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from gateway.adapters.base import (
    JSON,
    Batch,
    UpstreamTarget,
    bad_response,
    error_from_status,
)
from gateway.adapters.sse import SSEParser
from schemas import UpstreamError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from gateway.adapters.upstream_http import UpstreamHTTP

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_DONE = b"[DONE]"


class OpenAICompatAdapter:
    """Calls ``{base_url}/chat/completions`` and ``/embeddings`` on the pooled client."""

    def __init__(self, http: UpstreamHTTP) -> None:
        self._http = http

    @staticmethod
    def _payload(target: UpstreamTarget, body: JSON) -> tuple[bytes, dict[str, str]]:
        payload = dict(body)
        if target.upstream_model:
            payload["model"] = target.upstream_model
        headers = {"content-type": "application/json"}
        if target.api_key:
            headers["authorization"] = f"Bearer {target.api_key}"
        if target.trace_headers:
            headers.update(target.trace_headers)
        return _encode(payload), headers

    async def _post_json(self, target: UpstreamTarget, path: str, body: JSON, key: str) -> JSON:
        data, headers = self._payload(target, body)
        answer = await self._http.post(
            target.endpoint,
            target.base_url.rstrip("/") + path,
            data,
            headers,
            timeout=target.timeout,
            connect_timeout=target.connect_timeout,
        )
        if answer.status >= 300:
            raise error_from_status(target.endpoint, answer.status, answer.headers, answer.body)
        try:
            decoded = _decode(answer.body)
        except msgspec.DecodeError:
            raise bad_response(target.endpoint, "the body is not JSON") from None
        if not isinstance(decoded, dict) or key not in decoded:
            raise bad_response(target.endpoint, f"the JSON has no {key!r}")
        return decoded

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        """POST /chat/completions. Raises UpstreamError."""
        return await self._post_json(target, "/chat/completions", body, "choices")

    async def embed(self, target: UpstreamTarget, body: JSON) -> JSON:
        """POST /embeddings. Raises UpstreamError."""
        return await self._post_json(target, "/embeddings", body, "data")

    async def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        """POST /chat/completions with stream; yields the chunk dicts of each read until
        ``[DONE]``.

        Raises UpstreamError on a non-2xx answer, a broken connection, an in-band error, or
        a stream that ends without ``[DONE]`` (a silent truncation is never a success).
        """
        data, headers = self._payload(target, body)
        async with self._http.stream(
            target.endpoint,
            target.base_url.rstrip("/") + "/chat/completions",
            data,
            headers,
            timeout=target.timeout,
            connect_timeout=target.connect_timeout,
        ) as resp:
            if resp.status >= 300:
                raise error_from_status(
                    target.endpoint, resp.status, resp.headers, await resp.read()
                )
            parser = SSEParser()
            async for raw in resp.chunks():
                batch: list[JSON] = []
                done, failure = False, None
                for _event, event_data in parser.feed(raw):
                    if event_data == _DONE:
                        done = True
                        break
                    try:
                        batch.append(_chunk(target, event_data))
                    except UpstreamError as exc:
                        failure = exc  # the chunks before it still reach the client
                        break
                if batch:
                    yield Batch(batch, last=done)
                if failure is not None:
                    raise failure
                if done:
                    return
            raise UpstreamError(
                "upstream stream ended before [DONE]", endpoint=target.endpoint, kind="truncated"
            )


def _chunk(target: UpstreamTarget, data: bytes) -> JSON:
    """One stream event as a chunk dict. Raises UpstreamError (bad JSON, in-band error)."""
    try:
        chunk = _decode(data)
    except msgspec.DecodeError:
        raise bad_response(target.endpoint, "a stream event is not JSON") from None
    if not isinstance(chunk, dict):
        raise bad_response(target.endpoint, "a stream event is not an object")
    if "error" in chunk:
        err = chunk["error"]
        msg = err.get("message") if isinstance(err, dict) else str(err)
        raise UpstreamError(
            f"upstream stream error: {msg}", endpoint=target.endpoint, kind="stream_error"
        )
    return chunk
