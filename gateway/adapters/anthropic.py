"""``anthropic`` upstreams: the native Anthropic Messages API (``POST …/v1/messages``).

The canonical chat request is translated by ``anthropic_wire`` and sent with ``x-api-key``
and ``anthropic-version`` (and a Messages client's own ``anthropic-beta`` flags, which the
ingress carries on the request as ``_anthropic_beta``); answers and SSE streams come back as
canonical chat. A route's
``base_url`` may end in ``/v1`` or not: both reach ``…/v1/messages``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import msgspec

from gateway.adapters.anthropic_wire import (
    MessagesToChatStream,
    from_messages_response,
    to_messages_request,
)
from gateway.adapters.base import (
    JSON,
    Batch,
    UnsupportedParameterError,
    UpstreamTarget,
    bad_response,
    error_from_status,
    json_answer,
    json_event,
    rate_report,
)
from gateway.adapters.sse import SSEParser
from gateway.adapters.stream_batches import translated_batches
from schemas import InvalidRequestError, UpstreamError
from schemas.canonical_markers import ANTHROPIC_BETA as _ANTHROPIC_BETA
from schemas.canonical_markers import CLAUDE_NATIVE as _CLAUDE_NATIVE
from schemas.canonical_markers import RATE_REPORT as _RATE_REPORT

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from gateway.adapters.upstream_http import UpstreamHTTP

ANTHROPIC_VERSION = "2023-06-01"

_BETA_FLAGS = re.compile(r"[A-Za-z0-9._-]+(?: *, *[A-Za-z0-9._-]+)*")  # names, never more
_encode = msgspec.json.Encoder().encode
_LIMIT = "anthropic-ratelimit-requests-limit"  # an answer reporting its request limit says this
_decode = msgspec.json.Decoder().decode


def messages_url(base_url: str) -> str:
    """``{base_url}/v1/messages`` whether or not ``base_url`` already ends in ``/v1``."""
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base + "/v1/messages"


class AnthropicAdapter:
    """Calls ``/v1/messages`` on the pooled client; embeddings are refused."""

    def __init__(self, http: UpstreamHTTP) -> None:
        self._http = http

    def _request(
        self, target: UpstreamTarget, body: JSON, *, stream: bool
    ) -> tuple[bytes, dict[str, str]]:
        """The upstream request. Raises UnsupportedParameterError for what Anthropic cannot
        honour as asked (a 400 that names the field, and lets another route try)."""
        try:
            payload = to_messages_request(
                body, upstream_model=target.upstream_model or str(body.get("model", ""))
            )
        except InvalidRequestError as exc:
            raise UnsupportedParameterError(
                exc.message, endpoint=target.endpoint, param=exc.param
            ) from None
        if stream:
            payload["stream"] = True
        else:
            payload.pop("stream", None)
        headers = {"content-type": "application/json", "anthropic-version": ANTHROPIC_VERSION}
        beta = body.get(_ANTHROPIC_BETA)
        if type(beta) is str and _BETA_FLAGS.fullmatch(beta):
            headers["anthropic-beta"] = beta  # the Messages client's feature flags
        if target.api_key:
            headers["x-api-key"] = target.api_key
        if target.trace_headers:
            headers.update(target.trace_headers)
        return _encode(payload), headers

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        """POST /v1/messages; the answer as a canonical chat completion. Raises UpstreamError
        (UpstreamBadResponseError for an answer that breaks the API's shapes)."""
        payload, headers = self._request(target, body, stream=False)
        answer = await self._http.post(
            target.endpoint,
            messages_url(target.base_url),
            payload,
            headers,
            timeout=target.timeout,
            connect_timeout=target.connect_timeout,
        )
        if answer.status >= 300:
            raise error_from_status(target.endpoint, answer.status, answer.headers, answer.body)
        data = json_answer(target.endpoint, answer.body)
        if not isinstance(data, dict) or not isinstance(data.get("content"), list):
            raise bad_response(target.endpoint, "the JSON has no 'content' list")
        try:
            canonical = from_messages_response(
                data,
                model=target.upstream_model or str(data.get("model")),
                claude_stop=_CLAUDE_NATIVE in body,
            )
        except UpstreamError as exc:  # the translation knows the shapes, not the endpoint
            exc.endpoint = target.endpoint
            raise
        if _LIMIT in answer.headers and (rate := rate_report(answer.headers)) is not None:
            canonical[_RATE_REPORT] = rate
        return canonical

    async def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        """POST /v1/messages with stream; yields the canonical chunks of each read until
        ``message_stop``.

        Raises UpstreamError on a non-2xx answer, a broken connection, an ``error`` event, or
        a stream that ends without ``message_stop`` (a silent truncation is never a success);
        UpstreamBadResponseError on an event that breaks the API's shapes.
        """
        payload, headers = self._request(target, body, stream=True)
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        translator = MessagesToChatStream(
            target.upstream_model or str(body.get("model", "")),
            include_usage=include_usage,
            claude_stop=_CLAUDE_NATIVE in body,
        )
        async with self._http.stream(
            target.endpoint,
            messages_url(target.base_url),
            payload,
            headers,
            timeout=target.timeout,
            connect_timeout=target.connect_timeout,
        ) as resp:
            if resp.status >= 300:
                raise error_from_status(
                    target.endpoint, resp.status, resp.headers, await resp.read()
                )
            batches = translated_batches(
                resp.chunks(),
                SSEParser(target.endpoint).feed,
                lambda event: _translate(translator, target.endpoint, *event),
                translator,
            )
            rate = rate_report(resp.headers) if _LIMIT in resp.headers else None
            async for batch in batches:
                if rate is not None:  # said once, with the first batch
                    batch.rate, rate = rate, None
                yield batch
            if translator.is_complete:
                return
            raise UpstreamError(
                "upstream stream ended before message_stop",
                endpoint=target.endpoint,
                kind="truncated",
            )

    async def embed(self, target: UpstreamTarget, body: JSON) -> JSON:
        """Always raises UpstreamError (400): Anthropic has no embeddings API."""
        raise UpstreamError(
            f"route {target.endpoint} is of upstream kind anthropic, which has no embeddings API",
            endpoint=target.endpoint,
            status=400,
            kind="unsupported",
        )


def _translate(
    translator: MessagesToChatStream, endpoint: str, event: str | None, data: bytes
) -> list[JSON]:
    decoded = json_event(endpoint, data)
    try:
        return translator.feed(event, decoded)
    except UpstreamError as exc:  # an error event, or one the API's shapes do not allow
        exc.endpoint = endpoint
        raise
