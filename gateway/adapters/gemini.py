"""``gemini`` upstreams: the Gemini API's native ``generateContent`` (Google AI Studio keys).

Requests go to ``{base_url}/v1beta/models/{model}:generateContent`` (streams:
``:streamGenerateContent?alt=sse``, embeddings: ``:batchEmbedContents``) with the key in
``x-goog-api-key``; a ``base_url`` may end in ``/v1beta`` or not. ``gemini_wire`` translates.
Errors are Google's: a 429 ``RESOURCE_EXHAUSTED`` is a rate limit that lasts its
``RetryInfo.retryDelay`` (else ``Retry-After``), except a daily quota running out, which mutes
the key like a billing refusal; a 400 ``INVALID_ARGUMENT`` is the caller's. A prompt the safety
filter blocked is an answer (a refusal), not an error.
"""

from __future__ import annotations

import array
import base64
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import msgspec

from gateway.adapters.base import (
    JSON,
    Batch,
    UnsupportedParameterError,
    UpstreamTarget,
    bad_response,
    error_from_status,
    json_answer,
    json_event,
)
from gateway.adapters.gemini_wire import (
    GeminiToChatStream,
    from_gemini_response,
    to_embed_requests,
    to_gemini_request,
)
from gateway.adapters.platform_errors import google_duration
from gateway.adapters.sse import SSEParser
from gateway.adapters.stream_batches import translated_batches
from gateway.adapters.upstream_status import error_object
from schemas import (
    QUOTA_EXHAUSTED,
    RATE_LIMIT_EXCEEDED,
    InvalidRequestError,
    UpstreamBadResponseError,
    UpstreamError,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from gateway.adapters.upstream_http import UpstreamHTTP

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"


def model_url(base_url: str, model: str, method: str) -> str:
    """``{base_url}/v1beta/models/{model}:{method}`` whether or not ``base_url`` already ends
    in the API version."""
    base = base_url.rstrip("/")
    if not base.endswith(("/v1beta", "/v1")):
        base += "/v1beta"
    return f"{base}/models/{quote(model.removeprefix('models/'), safe='')}:{method}"


class GeminiAdapter:
    """Calls the Gemini API on the pooled client."""

    def __init__(self, http: UpstreamHTTP) -> None:
        self._http = http

    @staticmethod
    def _model(target: UpstreamTarget, body: JSON) -> str:
        return target.upstream_model or str(body.get("model", ""))

    @staticmethod
    def _headers(target: UpstreamTarget) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if target.api_key:
            headers["x-goog-api-key"] = target.api_key
        if target.trace_headers:
            headers.update(target.trace_headers)
        return headers

    @staticmethod
    def _translate(target: UpstreamTarget, body: JSON) -> bytes:
        """The request body. Raises UnsupportedParameterError for what Gemini cannot honour as
        asked (a 400 that names the field, and lets another route try)."""
        try:
            return _encode(to_gemini_request(body))
        except InvalidRequestError as exc:
            raise UnsupportedParameterError(
                exc.message, endpoint=target.endpoint, param=exc.param
            ) from None

    async def _post(self, target: UpstreamTarget, url: str, payload: bytes) -> JSON:
        answer = await self._http.post(
            target.endpoint,
            url,
            payload,
            self._headers(target),
            timeout=target.timeout,
            connect_timeout=target.connect_timeout,
        )
        if answer.status >= 300:
            raise gemini_error(target.endpoint, answer.status, answer.headers, answer.body)
        data = json_answer(target.endpoint, answer.body)
        if not isinstance(data, dict):
            raise bad_response(target.endpoint, "the JSON is not an object")
        return data

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        """POST :generateContent; the answer as a canonical chat completion. Raises
        UpstreamError (UpstreamBadResponseError for an answer that breaks the API's shapes)."""
        model = self._model(target, body)
        url = model_url(target.base_url, model, "generateContent")
        data = await self._post(target, url, self._translate(target, body))
        try:
            answer = from_gemini_response(data, model=model)
        except UpstreamError as exc:  # the translation knows the shapes, not the endpoint
            exc.endpoint = target.endpoint
            raise
        if not answer["choices"]:
            raise bad_response(target.endpoint, "the answer has no candidates")
        return answer

    async def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        """POST :streamGenerateContent?alt=sse; yields the canonical chunks of each read until
        every candidate finished.

        Raises UpstreamError on a non-2xx answer, a broken connection, an in-band error, or
        a stream that ends before a finish reason (a silent truncation is never a success);
        UpstreamBadResponseError on a chunk that breaks the API's shapes.
        """
        model = self._model(target, body)
        payload = self._translate(target, body)
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        translator = GeminiToChatStream(model, include_usage=include_usage)
        url = model_url(target.base_url, model, "streamGenerateContent") + "?alt=sse"
        async with self._http.stream(
            target.endpoint,
            url,
            payload,
            self._headers(target),
            timeout=target.timeout,
            connect_timeout=target.connect_timeout,
        ) as resp:
            if resp.status >= 300:
                raise gemini_error(target.endpoint, resp.status, resp.headers, await resp.read())
            batches = translated_batches(
                resp.chunks(),
                SSEParser(target.endpoint).feed,
                lambda event: _translate(translator, target.endpoint, event[1]),
                translator,
            )
            async for batch in batches:
                yield batch
            if translator.is_complete:
                return
            raise UpstreamError(
                "upstream stream ended before a finish reason",
                endpoint=target.endpoint,
                kind="truncated",
            )

    async def embed(self, target: UpstreamTarget, body: JSON) -> JSON:
        """POST :batchEmbedContents; the vectors in the OpenAI shape. Raises UpstreamError."""
        model = self._model(target, body)
        try:
            requests = to_embed_requests(body, model)
        except InvalidRequestError as exc:
            raise UnsupportedParameterError(
                exc.message, endpoint=target.endpoint, param=exc.param
            ) from None
        url = model_url(target.base_url, model, "batchEmbedContents")
        data = await self._post(target, url, _encode({"requests": requests}))
        vectors = data.get("embeddings")
        if not isinstance(vectors, list) or len(vectors) != len(requests):
            raise bad_response(target.endpoint, "the answer has not one embedding per input")
        as_base64 = body.get("encoding_format") == "base64"
        items = []
        for index, item in enumerate(vectors):
            values = item.get("values") if type(item) is dict else None
            try:  # ContentEmbedding.values: list[float] ("a" or a true is no vector's)
                values = msgspec.convert(values, list[float])
            except msgspec.ValidationError:
                raise bad_response(
                    target.endpoint, "an embedding's values are not numbers"
                ) from None
            vector = (
                base64.b64encode(array.array("f", values).tobytes()).decode()
                if as_base64
                else values
            )
            items.append({"object": "embedding", "index": index, "embedding": vector})
        # batchEmbedContents reports no usage: unknown (billed on the estimate), never 0 tokens
        return {"object": "list", "data": items, "model": model, "usage": None}


def _translate(translator: GeminiToChatStream, endpoint: str, data: bytes) -> list[JSON]:
    try:
        return translator.feed(_event_of(endpoint, data))
    except UpstreamBadResponseError as exc:  # the translation knows the shapes, not the endpoint
        exc.endpoint = endpoint
        raise


def _event_of(endpoint: str, data: bytes) -> JSON:
    """One streamed answer. Raises UpstreamError (bad JSON, an in-band error)."""
    decoded = json_event(endpoint, data)
    err = decoded.get("error")
    if err is not None:
        code = err.get("code") if isinstance(err, dict) else None
        # A bool is an int to isinstance: ``"code": true`` made an error of status True,
        # which no observation of it could carry.
        failure = gemini_error(endpoint, code if type(code) is int else 500, {}, data)
        failure.message = f"upstream stream error: {failure.message}"
        failure.args = (failure.message,)
        if failure.kind.startswith("http_"):  # a quota's kind says more than where it came
            failure.kind = "stream_error"
        raise failure
    return decoded


def gemini_error(
    endpoint: str, status: int, headers: Mapping[str, str], body: bytes
) -> UpstreamError:
    """The UpstreamError for a Google error answer: a rate limit with its ``retryDelay``, a
    daily quota or billing refusal as :data:`QUOTA_EXHAUSTED`, a 429 naming a quota of a
    shorter period (per minute) as :data:`RATE_LIMIT_EXCEEDED`, anything else by status."""
    err = error_from_status(endpoint, status, headers, body)
    info = error_object(body).get("error")
    if not isinstance(info, dict):
        return err
    details = _objects(info.get("details"))
    if status == 429 or info.get("status") == "RESOURCE_EXHAUSTED":
        # Decided here from the details alone: Google's per-minute 429 says "You exceeded your
        # current quota ... billing details" too, so its words tell a pace from a quota no
        # better than a generic reading would.
        failures = [d for d in details if d.get("@type") == _QUOTA_FAILURE]
        if any(_daily(d) for d in failures):
            err.kind = QUOTA_EXHAUSTED
        elif failures and status == 429:
            err.kind = RATE_LIMIT_EXCEEDED  # a per-minute quota: a pace
        else:
            err.kind = f"http_{status}"
        for detail in details:
            if detail.get("@type") == _RETRY_INFO:
                delay = google_duration(detail.get("retryDelay"))
                err.retry_after = delay if delay is not None else err.retry_after
    message = str(info.get("message", "")).lower()
    if status == 403 and ("billing" in message or "quota" in message):
        err.kind = QUOTA_EXHAUSTED
    return err


def _daily(quota_failure: JSON) -> bool:
    """Whether a QuotaFailure names a per-day quota: it will not come back in seconds."""
    for violation in _objects(quota_failure.get("violations")):
        if "PerDay" in str(violation.get("quotaId", "")):
            return True
    return False


def _objects(items: Any) -> list[JSON]:
    """The objects of ``items`` when it is a list (an error's ``details``, a QuotaFailure's
    ``violations``); none for anything else (a number there was a 500)."""
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []
