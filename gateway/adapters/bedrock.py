"""``bedrock`` upstreams: AWS Bedrock's Converse and ConverseStream APIs.

``POST {base_url}/model/{modelId}/converse`` (JSON) and ``/converse-stream`` (the AWS binary
event-stream, ``application/vnd.amazon.eventstream``), SigV4-signed by ``bedrock_auth``. The
stream is decoded incrementally by botocore's ``EventStreamBuffer`` (which checks both CRCs)
as the upstream client hands the body over.

Errors keep the caller's and the provider's view apart: ``ThrottlingException`` and
``ServiceQuotaExceededException`` are rate limits (429, with any ``Retry-After``);
``AccessDeniedException`` and ``UnrecognizedClientException`` reject the credential (401: the
key is muted); ``ValidationException`` is the caller's (400); model and service failures are
retryable 5xx.

For Claude, a Messages client's ``anthropic-beta`` flags that Bedrock documents
(:data:`BEDROCK_BETAS`) go in ``additionalModelRequestFields.anthropic_beta``; the rest are
dropped, as Bedrock refuses a request naming a flag it does not know.

Embeddings go through ``InvokeModel`` (``POST {base_url}/model/{modelId}/invoke``, signed the
same way) with the model family's own body (``bedrock_embed``): Titan embeds one input per
call, so a batch is that many calls, at most ``embed_parallel`` (8) at a time.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import msgspec
from yarl import URL

from gateway.adapters.base import (
    JSON,
    Batch,
    UnsupportedParameterError,
    UpstreamTarget,
    bad_response,
    json_answer,
    json_event,
    redacted,
    retry_after_seconds,
)
from gateway.adapters.bedrock_auth import BedrockSigner, split_key
from gateway.adapters.bedrock_embed import (
    InvokeCall,
    embedding_answer,
    invoke_calls,
    tokens_of,
    vectors_of,
)
from gateway.adapters.bedrock_stream import (
    CLAUDE_STOPS,
    MATCHED_STOP,
    ConverseToChatStream,
    matched_stop,
)
from gateway.adapters.bedrock_wire import from_converse_response, to_converse_request
from gateway.adapters.stream_batches import translated_batches
from gateway.adapters.upstream_status import error_object
from schemas import InvalidRequestError, UpstreamError
from schemas.bedrock_settings import is_claude
from schemas.canonical_markers import ANTHROPIC_BETA as _ANTHROPIC_BETA
from schemas.canonical_markers import CLAUDE_NATIVE as _CLAUDE_NATIVE
from schemas.canonical_markers import CLAUDE_STOP_REASON as STOP_REASON
from schemas.keys import shown

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping

    from gateway.adapters.upstream_http import UpstreamHTTP

logger = logging.getLogger(__name__)
_encode = msgspec.json.Encoder().encode

_decode = msgspec.json.Decoder().decode
_T = TypeVar("_T")
_EMBED_PARALLEL = 8  # InvokeModel calls one embeddings request has in flight at most

# Exception name -> (the status the gateway reports, error kind). Names not here keep the
# HTTP status they came with.
_ERRORS: dict[str, tuple[int, str]] = {
    "throttlingexception": (429, "rate_limited"),
    "servicequotaexceededexception": (429, "rate_limited"),
    "accessdeniedexception": (401, "auth"),
    "unrecognizedclientexception": (401, "auth"),
    "invalidsignatureexception": (401, "auth"),
    "validationexception": (400, "invalid_request"),
    "resourcenotfoundexception": (404, "not_found"),
    "modeltimeoutexception": (408, "timeout"),
    "modelnotreadyexception": (503, "model_not_ready"),
    "modelerrorexception": (502, "model_error"),
    "modelstreamerrorexception": (502, "model_error"),
    "internalserverexception": (500, "internal_error"),
    "serviceunavailableexception": (503, "unavailable"),
}


def converse_url(base_url: str, model_id: str, *, stream: bool) -> str:
    """``{base_url}/model/{modelId}/converse[-stream]``, the model id percent-encoded as
    botocore does (``anthropic.claude-v2:1`` -> ``anthropic.claude-v2%3A1``)."""
    op = "converse-stream" if stream else "converse"
    return model_url(base_url, model_id, op)


def model_url(base_url: str, model_id: str, op: str) -> str:
    """``{base_url}/model/{modelId}/{op}``, the model id percent-encoded as botocore does."""
    return f"{base_url.rstrip('/')}/model/{quote(model_id, safe='')}/{op}"


# The anthropic_beta values AWS's Bedrock documentation lists for Anthropic Claude ("Anthropic
# Claude Messages API" > "Request and Response", the anthropic_beta parameter), as recalled when
# written: check them against that page when it changes. Bedrock refuses
# the whole request for a flag it does not know (Claude Code sends claude-code-20250219 among
# others), so only these are passed on.
BEDROCK_BETAS = frozenset(
    {
        "computer-use-2024-10-22",
        "computer-use-2025-01-24",
        "token-efficient-tools-2025-02-19",
        "output-128k-2025-02-19",
        "interleaved-thinking-2025-05-14",
        "dev-full-thinking-2025-05-14",
        "context-1m-2025-08-07",
        "context-management-2025-06-27",
        "tool-search-tool-2025-10-19",
        "tool-examples-2025-10-29",
        "effort-2025-11-24",
    }
)


def bedrock_betas(header: Any) -> list[str]:
    """The flags of a Messages client's ``anthropic-beta`` ``header`` that Bedrock documents,
    in the client's order; the others are dropped (logged at debug)."""
    flags = [f.strip() for f in header.split(",")] if isinstance(header, str) else []
    kept = [f for f in dict.fromkeys(flags) if f in BEDROCK_BETAS]
    if dropped := [f for f in flags if f and f not in BEDROCK_BETAS]:
        said = shown(dropped, 200)
        logger.debug("anthropic-beta flags Bedrock does not document, dropped: %s", said)
    return kept


def _claude(target: UpstreamTarget, model: str) -> bool:
    # An application inference profile's ARN does not show its model: the route says.
    settings = target.bedrock
    return (settings is not None and settings.model_family == "anthropic") or is_claude(model)


# Converse refuses toolUse and toolResult blocks in a request without a toolConfig, which one
# asked with no tools (a summary of a tool loop) or with tool_choice none (Converse has no
# "none": the tools are left out) has not: this tool, which no answer is meant to call, stands
# in, as LiteLLM's dummy tool does.
_NO_TOOL: JSON = {
    "tools": [
        {
            "toolSpec": {
                "name": "no_tool_available",
                "description": "No tool is available in this turn. Never call this.",
                "inputSchema": {"json": {"type": "object", "properties": {}}},
            }
        }
    ]
}


def _holds_tool_blocks(messages: list[JSON]) -> bool:
    """Whether Converse ``messages`` hold a toolUse or toolResult block."""
    return any(
        "toolUse" in block or "toolResult" in block
        for message in messages
        for block in message["content"]
    )


class BedrockAdapter:
    """Calls Converse/ConverseStream, and InvokeModel for embeddings, on the pooled client."""

    def __init__(self, http: UpstreamHTTP, *, embed_parallel: int = _EMBED_PARALLEL) -> None:
        self._http = http
        self._signer = BedrockSigner()
        self._embed_parallel = embed_parallel

    async def _request(
        self, target: UpstreamTarget, body: JSON, *, stream: bool
    ) -> tuple[URL, bytes, dict[str, str]]:
        try:
            model = target.upstream_model or str(body.get("model", ""))
            claude = _claude(target, model)
            converse = to_converse_request(body, claude=claude)
            if claude and (betas := bedrock_betas(body.get(_ANTHROPIC_BETA))):
                extra = converse.setdefault("additionalModelRequestFields", {})
                extra["anthropic_beta"] = betas
            if claude and "stopSequences" in converse.get("inferenceConfig", ()):
                # Claude's answer says which one matched only when asked (Anthropic's
                # stop_sequence); other models' field paths are their own.
                converse["additionalModelResponseFieldPaths"] = [MATCHED_STOP]
            if "toolConfig" not in converse and _holds_tool_blocks(converse["messages"]):
                converse["toolConfig"] = _NO_TOOL
            payload = _encode(converse)
        except InvalidRequestError as exc:
            raise UnsupportedParameterError(
                exc.message, endpoint=target.endpoint, param=exc.param
            ) from None
        url = converse_url(target.base_url, model, stream=stream)
        accept = "application/vnd.amazon.eventstream" if stream else "application/json"
        headers = {"content-type": "application/json", "accept": accept}
        signed = await self._signer.sign(target, url, payload, headers)
        # encoded=True: the path must go out exactly as it was signed (%3A stays %3A).
        return URL(url, encoded=True), payload, signed

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        """Converse; the answer as a canonical chat completion. Raises UpstreamError
        (UpstreamBadResponseError for an answer that breaks the service model's shapes)."""
        try:
            url, payload, headers = await self._request(target, body, stream=False)
            answer = await self._http.post(
                target.endpoint,
                url,
                payload,
                headers,
                timeout=target.timeout,
                connect_timeout=target.connect_timeout,
            )
            if answer.status >= 300:
                raise error_from_answer(target.endpoint, answer.status, answer.headers, answer.body)
            data = json_answer(target.endpoint, answer.body)
            output = data.get("output") if isinstance(data, dict) else None
            message = output.get("message") if isinstance(output, dict) else None
            if not isinstance(message, dict):
                raise bad_response(target.endpoint, "the JSON has no 'output.message'")
            model = target.upstream_model or str(body.get("model", ""))
            chat = from_converse_response(data, model=model)
            if _CLAUDE_NATIVE in body and data.get("stopReason") in CLAUDE_STOPS:
                chat["choices"][0][STOP_REASON] = data["stopReason"]  # for a Messages client
            if (matched := matched_stop(data)) is not None:
                chat["choices"][0]["stop_reason"] = matched  # vLLM's field, as Claude's
            return chat
        except UpstreamError as err:
            raise _redacted(err, target) from None

    async def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        """ConverseStream; yields the canonical chunks of each read until the answer ends.

        Raises UpstreamError on a non-2xx answer, a broken connection or framing (a CRC that
        does not match), an exception event, or a stream that ends before ``messageStop``;
        UpstreamBadResponseError on an event that breaks the service model's shapes.
        """
        from botocore.eventstream import EventStreamBuffer, ParserError

        try:
            url, payload, headers = await self._request(target, body, stream=True)
            options = body.get("stream_options")
            translator = ConverseToChatStream(
                target.upstream_model or str(body.get("model", "")),
                include_usage=isinstance(options, dict) and options.get("include_usage") is True,
                claude_stop=_CLAUDE_NATIVE in body,
            )
            async with self._http.stream(
                target.endpoint,
                url,
                payload,
                headers,
                timeout=target.timeout,
                connect_timeout=target.connect_timeout,
            ) as resp:
                if resp.status >= 300:
                    raise error_from_answer(
                        target.endpoint, resp.status, resp.headers, await resp.read()
                    )
                frames = EventStreamBuffer()

                def messages(raw: bytes) -> Iterator[Any]:
                    frames.add_data(raw)
                    try:
                        yield from frames
                    except ParserError:
                        raise bad_response(target.endpoint, "the event stream is corrupt") from None

                batches = translated_batches(
                    resp.chunks(),
                    messages,
                    lambda message: _translate(translator, target.endpoint, message),
                    translator,
                )
                async for batch in batches:
                    yield batch
                if translator.is_complete:
                    return
                tail = translator.finish()
                if tail:
                    yield Batch(tail, last=True)
                    return
                raise UpstreamError(
                    "upstream stream ended before messageStop",
                    endpoint=target.endpoint,
                    kind="truncated",
                )
        except UpstreamError as err:
            raise _redacted(err, target) from None

    async def embed(self, target: UpstreamTarget, body: JSON) -> JSON:
        """InvokeModel with the model family's bodies; the vectors in the OpenAI shape.

        Raises UpstreamError: a 400 that spares the endpoint for a model of no embeddings
        family Bedrock serves (or an input or option it cannot take), else as Converse does.
        """
        model = target.upstream_model or str(body.get("model", ""))
        try:
            calls = invoke_calls(body, model)
        except InvalidRequestError as exc:
            raise UnsupportedParameterError(
                exc.message, endpoint=target.endpoint, param=exc.param
            ) from None
        try:
            answers = await _bounded(
                [self._invoker(target, model, call) for call in calls], self._embed_parallel
            )
        except UpstreamError as err:
            raise _redacted(err, target) from None
        vectors: list[list[float]] = []
        tokens: int | None = 0
        for call, (data, headers) in zip(calls, answers, strict=True):
            found = vectors_of(data, call)
            if found is None:
                raise bad_response(target.endpoint, "the answer has not one embedding per input")
            vectors.extend(found)
            count = tokens_of(data, headers)
            tokens = None if tokens is None or count is None else tokens + count
        as_base64 = body.get("encoding_format") == "base64"
        return embedding_answer(vectors, model=model, tokens=tokens, as_base64=as_base64)

    def _invoker(
        self, target: UpstreamTarget, model: str, call: InvokeCall
    ) -> Callable[[], Awaitable[tuple[Any, Mapping[str, str]]]]:
        async def invoke() -> tuple[Any, Mapping[str, str]]:
            payload = _encode(call.body)
            url = model_url(target.base_url, model, "invoke")
            headers = {"content-type": "application/json", "accept": "application/json"}
            signed = await self._signer.sign(target, url, payload, headers)
            answer = await self._http.post(
                target.endpoint,
                URL(url, encoded=True),
                payload,
                signed,
                timeout=target.timeout,
                connect_timeout=target.connect_timeout,
            )
            if answer.status >= 300:
                raise error_from_answer(target.endpoint, answer.status, answer.headers, answer.body)
            return json_answer(target.endpoint, answer.body), answer.headers

        return invoke


async def _bounded(calls: list[Callable[[], Awaitable[_T]]], limit: int) -> list[_T]:
    """Every call's result in order, at most ``limit`` running at once; the first failure
    cancels the rest and is raised as itself."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[_T]]) -> _T:
        async with gate:
            return await call()

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(call)) for call in calls]
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]


def _translate(translator: ConverseToChatStream, endpoint: str, message: Any) -> list[JSON]:
    headers: Mapping[str, Any] = message.headers
    kind = headers.get(":message-type")
    if kind == "exception":
        name = str(headers.get(":exception-type") or "")
        raise error_from_event(endpoint, name, _message_of(message.payload))
    if kind == "error":
        name = str(headers.get(":error-code") or "")
        raise error_from_event(endpoint, name, str(headers.get(":error-message") or name))
    payload = json_event(endpoint, message.payload)
    return translator.feed(str(headers.get(":event-type") or ""), payload)


def error_from_answer(
    endpoint: str, status: int, headers: Mapping[str, str], body: bytes
) -> UpstreamError:
    """An UpstreamError for a non-2xx Converse answer, classified by its exception name
    (``x-amzn-ErrorType``, else the body's ``__type``/``code``) and keeping its message."""
    data = error_object(body)
    name = headers.get("x-amzn-errortype") or str(data.get("__type") or data.get("code") or "")
    name = name.split(":", 1)[0].rsplit("#", 1)[-1]
    message = _message_of(body) or f"upstream answered HTTP {status}"
    mapped, kind = _ERRORS.get(name.lower(), (status, f"http_{status}"))
    return UpstreamError(
        message,
        endpoint=endpoint,
        status=mapped,
        body=body,
        retry_after=retry_after_seconds(headers),
        kind=kind,
    )


def error_from_event(endpoint: str, name: str, message: str) -> UpstreamError:
    """An UpstreamError for an exception event mid-stream (``throttlingException``...)."""
    status, kind = _ERRORS.get(name.lower(), (502, "stream_error"))
    return UpstreamError(message or name, endpoint=endpoint, status=status, kind=kind)


def _message_of(body: bytes) -> str:
    data = error_object(body)
    for key in ("message", "Message"):
        if isinstance(data.get(key), str):
            return str(data[key])
    err = data.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    return ""


def _redacted(err: UpstreamError, target: UpstreamTarget) -> UpstreamError:
    # The translation raises for misshapen answers knowing the shapes, not the endpoint.
    err.endpoint = err.endpoint or target.endpoint
    # The route key is ID:SECRET[:TOKEN]; an upstream could echo any part of it.
    if target.api_key:
        try:
            parts: tuple[str | None, ...] = (target.api_key, *split_key(target.api_key))
        except ValueError:
            parts = (target.api_key,)
        for part in parts:  # the whole key first, so it reads as one [redacted]
            if part:
                redacted(err, part)
    return err
