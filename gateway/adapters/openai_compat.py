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
    json_answer,
    rate_limit_spent_seconds,
)
from gateway.adapters.sse import SSEParser
from schemas import UpstreamError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from gateway.adapters.upstream_http import UpstreamHTTP

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_DONE = b"[DONE]"


class OpenAICompatAdapter:
    """Calls ``{base_url}/chat/completions`` and ``/embeddings`` on the pooled client.

    Platforms that speak this wire at other URLs or with other credentials (``azure_openai``)
    subclass it and override :meth:`_url`, :meth:`_auth` and :meth:`_error`."""

    def __init__(self, http: UpstreamHTTP) -> None:
        self._http = http

    def _url(self, target: UpstreamTarget, path: str) -> str:
        """Where ``path`` (``/chat/completions``, ``/embeddings``) lives for ``target``."""
        return target.base_url.rstrip("/") + path

    async def _auth(self, target: UpstreamTarget) -> dict[str, str]:
        """The credential headers. Raises UpstreamError when the credential is unavailable."""
        return {"authorization": f"Bearer {target.api_key}"} if target.api_key else {}

    def _error(
        self, target: UpstreamTarget, status: int, headers: Mapping[str, str], body: bytes
    ) -> UpstreamError:
        """The UpstreamError for a non-2xx answer."""
        return error_from_status(target.endpoint, status, headers, body)

    def _relayed(self, chunk: JSON) -> bool:
        """Whether a stream chunk is part of the canonical stream (all of them, here)."""
        return True

    async def _payload(self, target: UpstreamTarget, body: JSON) -> tuple[bytes, dict[str, str]]:
        payload = dict(body)
        if target.upstream_model:
            payload["model"] = target.upstream_model
        headers = {"content-type": "application/json", **await self._auth(target)}
        if target.trace_headers:
            headers.update(target.trace_headers)
        return _encode(payload), headers

    async def _post_json(self, target: UpstreamTarget, path: str, body: JSON, key: str) -> JSON:
        data, headers = await self._payload(target, body)
        answer = await self._http.post(
            target.endpoint,
            self._url(target, path),
            data,
            headers,
            timeout=target.timeout,
            connect_timeout=target.connect_timeout,
        )
        if answer.status >= 300:
            raise self._error(target, answer.status, answer.headers, answer.body)
        decoded = json_answer(target.endpoint, answer.body)
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
        data, headers = await self._payload(target, body)
        async with self._http.stream(
            target.endpoint,
            self._url(target, "/chat/completions"),
            data,
            headers,
            timeout=target.timeout,
            connect_timeout=target.connect_timeout,
        ) as resp:
            if resp.status >= 300:
                raise self._error(target, resp.status, resp.headers, await resp.read())
            parser = SSEParser()
            spent_for = rate_limit_spent_seconds(resp.headers)
            async for raw in resp.chunks():
                batch: list[JSON] = []
                done, failure = False, None
                for _event, event_data in parser.feed(raw):
                    if event_data == _DONE:
                        done = True
                        break
                    try:
                        chunk = _chunk(target, event_data)
                    except UpstreamError as exc:
                        failure = exc  # the chunks before it still reach the client
                        break
                    if self._relayed(chunk):
                        batch.append(chunk)
                if batch:
                    yield Batch(batch, last=done, spent_for=spent_for)
                    spent_for = None  # said once, with the first batch
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
