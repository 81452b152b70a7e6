"""``openai_compat`` upstreams: OpenAI, vLLM, SGLang, Ollama, OpenRouter-style servers.

The canonical shape *is* this wire shape, so requests pass through with only ``model``
replaced by the route's ``provider_model_id``, and without Claude's thinking: the top-level
``thinking`` config the Messages surface marks as Claude's (``_CLAUDE_THINKING``) and
assistant messages' signed ``thinking_blocks`` (what it carries for an ``anthropic`` route)
are Anthropic's, and the OpenAI API refuses an argument it does not know; so are the
``cache_control`` marks the Messages surface keeps for Claude (``_CLAUDE_CACHE``: on the
request, its tools and content parts), its client's ``anthropic-beta`` flags
(``_ANTHROPIC_BETA``) and what else it asks only of Claude (``_CLAUDE_NATIVE``: ``top_k``,
``is_error``, which the tool message's ``Error: `` prefix still says). A chat client's own
``thinking`` (GLM's, DeepSeek's, Volcengine Ark's extension) and marks pass through, as any
field this gateway does not read.
A request whose ``max_tokens`` the upstream refuses for ``max_completion_tokens`` (OpenAI's
o-series and gpt-5, to a limit the Messages or Responses surface named) is sent again, once,
with the limit so named, and so named from then on for that endpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.adapters.base import (
    JSON,
    Batch,
    UpstreamTarget,
    bad_response,
    error_from_status,
    json_answer,
    rate_limit_spent_seconds,
    rate_report,
)
from gateway.adapters.openai_compat_stream import CallNumbers, as_sse, once
from gateway.adapters.sse import SSEParser
from schemas import UpstreamError
from schemas.canonical_markers import ANTHROPIC_BETA as _ANTHROPIC_BETA
from schemas.canonical_markers import CLAUDE_CACHE as _CLAUDE_CACHE
from schemas.canonical_markers import CLAUDE_NATIVE as _CLAUDE_NATIVE
from schemas.canonical_markers import CLAUDE_THINKING as _CLAUDE_THINKING
from schemas.canonical_markers import RATE_REPORT as _RATE_REPORT
from schemas.text_chunk import Chunk, text_chunk

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping
    from contextlib import AbstractAsyncContextManager

    from gateway.adapters.upstream_http import StreamAnswer, UpstreamHTTP
    from schemas.routing import RateReport

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_DONE = b"[DONE]"


class OpenAICompatAdapter:
    """Calls ``{base_url}/chat/completions`` and ``/embeddings`` on the pooled client.

    Platforms that speak this wire at other URLs or with other credentials (``azure_openai``)
    subclass it and override :meth:`_url`, :meth:`_auth` and :meth:`_error`."""

    def __init__(self, http: UpstreamHTTP) -> None:
        self._http = http
        # Endpoints that refused ``max_tokens`` asking for ``max_completion_tokens`` (OpenAI's
        # o-series and gpt-5): a translated request (Messages, Responses) names its limit so.
        self._completion_tokens: set[str] = set()
        # Whether a stream's text chunks may be decoded as TextChunks, which ``_relayed``
        # never sees: not where a subclass filters chunks (Azure drops its filter results').
        self._typed_chunks = type(self)._relayed is OpenAICompatAdapter._relayed

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
        if payload.pop(_CLAUDE_THINKING, None):  # a chat client's own thinking goes on
            payload.pop("thinking", None)
        if payload.pop(_CLAUDE_CACHE, None):  # a chat client's own marks go on
            _drop_cache_marks(payload)
        payload.pop(_ANTHROPIC_BETA, None)
        payload.pop(_CLAUDE_NATIVE, None)
        if self._completion_tokens and target.endpoint in self._completion_tokens:
            if "max_tokens" in payload and "max_completion_tokens" not in payload:
                payload["max_completion_tokens"] = payload.pop("max_tokens")
        if target.upstream_model:
            payload["model"] = target.upstream_model
        messages: Any = payload.get("messages")
        # Every request comes here: a plain loop with one key test per message (about 40 ns
        # each; a generator in any() cost twice that, a search of the encoded bytes grows with
        # the text), a copy only for a Claude history, which is rare.
        for message in messages if type(messages) is list else ():
            if type(message) is dict and "thinking_blocks" in message:
                payload["messages"] = [_without_thinking(m) for m in messages]
                break
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
        # Asked first: most servers but OpenAI's and Azure's report no limit (no call then).
        # Embeddings answers report theirs too (an embedding model's own limit).
        if _LIMIT in answer.headers and (rate := rate_report(answer.headers)) is not None:
            decoded[_RATE_REPORT] = rate
        return decoded

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        """POST /chat/completions. Raises UpstreamError."""
        try:
            return await self._post_json(target, "/chat/completions", body, "choices")
        except UpstreamError as err:
            if not self._learned_completion_tokens(target, body, err):
                raise
        return await self._post_json(target, "/chat/completions", body, "choices")

    def _learned_completion_tokens(
        self, target: UpstreamTarget, body: JSON, err: UpstreamError
    ) -> bool:
        """Whether ``err`` is the upstream refusing ``body``'s ``max_tokens`` for the
        ``max_completion_tokens`` it names (OpenAI: "Unsupported parameter: 'max_tokens' is
        not supported with this model. Use 'max_completion_tokens' instead."), learnt for
        ``target``'s endpoint: the request is then sent again, once, so named."""
        if err.status != 400 or b"max_completion_tokens" not in err.body:
            return False
        if "max_tokens" not in body or "max_completion_tokens" in body:
            return False
        self._completion_tokens.add(target.endpoint)
        return True

    async def embed(self, target: UpstreamTarget, body: JSON) -> JSON:
        """POST /embeddings. Raises UpstreamError."""
        return await self._post_json(target, "/embeddings", body, "data")

    def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        """POST /chat/completions with stream; yields the chunk dicts of each read until
        ``[DONE]``, or until the answer's body ends cleanly without it (nothing is sent before
        the first ``__anext__``): whether such a stream is whole (every choice said why it
        stopped) is the relay's to judge, as it sees every chunk (``StreamAttempt``).

        A server that ignores ``stream`` and answers the whole completion as JSON has it
        relayed as the chunks equivalent to it.

        Raises UpstreamError on a non-2xx answer, a broken connection (a body cut short of
        its chunked terminator or length), an in-band error, or a JSON answer that is not a
        completion.
        """
        return _ChatStream(self, target, body)


class _ChatStream:
    """The batches of one :meth:`OpenAICompatAdapter.stream`, the upstream's answer held
    open from the first ``__anext__`` until the stream ends, fails or is closed
    (``aclose``). A class, not an async generator: every stream paid for the generator's
    creation, the event loop's hooks and its closing, each request once more per layer."""

    __slots__ = (
        "_adapter",
        "_body",
        "_context",
        "_done",
        "_failure",
        "_numbers",
        "_parser",
        "_pieces",
        "_rate",
        "_spent_for",
        "_target",
        "_typed",
    )

    def __init__(self, adapter: OpenAICompatAdapter, target: UpstreamTarget, body: JSON) -> None:
        self._adapter = adapter
        self._target = target
        self._body: JSON | None = body
        self._context: AbstractAsyncContextManager[StreamAnswer] | None = None
        self._pieces: AsyncIterator[bytes] | None = None
        self._parser = SSEParser(target.endpoint)
        self._spent_for: float | None = None
        self._rate: RateReport | None = None
        self._done = False  # ``[DONE]`` came: nothing follows the batch it came with
        self._failure: UpstreamError | None = None  # raised after the chunks before it
        self._numbers: CallNumbers | None = None  # made at the first tool call
        self._typed = adapter._typed_chunks  # text chunks decoded as TextChunks: see _batch

    def __aiter__(self) -> _ChatStream:
        return self

    async def __anext__(self) -> Batch:
        try:
            if self._pieces is None:
                if self._body is None:  # ended, or closed before it began
                    raise StopAsyncIteration
                await self._open()
                assert self._pieces is not None
            while True:
                if self._failure is not None:
                    raise self._failure
                if self._done:
                    raise StopAsyncIteration
                raw = await anext(self._pieces)  # its end: the body ended cleanly
                batch = self._batch(raw)
                if batch is not None:
                    return batch
        except BaseException:
            # Whatever ends the stream (its end, its error, a cancellation) releases it.
            await self.aclose()
            raise

    async def _open(self, again: bool = False) -> None:
        adapter, target, body = self._adapter, self._target, self._body
        assert body is not None
        self._body = None
        data, headers = await adapter._payload(target, body)
        context = adapter._http.stream(
            target.endpoint,
            adapter._url(target, "/chat/completions"),
            data,
            headers,
            timeout=target.timeout,
            connect_timeout=target.connect_timeout,
        )
        resp = await context.__aenter__()
        self._context = context
        if resp.status >= 300:
            err = adapter._error(target, resp.status, resp.headers, await resp.read())
            if again or not adapter._learned_completion_tokens(target, body, err):
                raise err
            await self.aclose()
            self._body, self._done = body, False
            return await self._open(again=True)
        self._rate = rate_report(resp.headers) if _LIMIT in resp.headers else None
        self._spent_for = rate_limit_spent_seconds(resp.headers, paced=self._rate)
        if resp.headers.get("content-type", "").lower().startswith("application/json"):
            # A server that ignores ``stream`` answered the whole completion: relayed as its
            # chunks, in the SSE they would have come in, the stream's own path reads them.
            self._pieces = once(as_sse(target, await resp.read()))
        else:
            self._pieces = resp.chunks()

    def _batch(self, raw: bytes) -> Batch | None:
        """The chunks of one read (None if it completed none); notes ``[DONE]`` and an
        in-band failure."""
        batch: list[Chunk] = []
        adapter = self._adapter
        for _event, event_data in self._parser.feed(raw):
            if event_data == _DONE:
                self._done = True
                break
            # Text is decoded first, searched once that fails, or first where a failure (its
            # exception) is likely: a stream that sent a tool call, a chunk ending in an object
            # (the usage chunk). Those are the dict path's; any other refused sends the rest.
            calls = self._numbers is not None and event_data.find(_TOOL_CALLS) >= 0
            usage = event_data[-2:-1] == b"}" and event_data.find(_USAGE_OBJECT) >= 0
            if self._typed and not (calls or usage) and (text := text_chunk(event_data)):
                batch.append(text)  # the common chunk, checked by its type
                continue
            calls = calls or event_data.find(_TOOL_CALLS) >= 0
            self._typed = self._typed and (calls or usage or event_data.find(_USAGE_OBJECT) >= 0)
            try:
                chunk = _chunk(self._target, event_data)
            except UpstreamError as exc:
                self._failure = exc  # the chunks before it still reach the client
                break
            if calls:
                if self._numbers is None:
                    self._numbers = CallNumbers()
                self._numbers.number(chunk)
            if adapter._relayed(chunk):
                batch.append(chunk)
        if not batch:
            return None
        # Said once, with the first batch.
        spent_for, self._spent_for = self._spent_for, None
        rate, self._rate = self._rate, None
        return Batch(batch, last=self._done, spent_for=spent_for, rate=rate)

    async def aclose(self) -> None:
        """Release the upstream's answer (idempotent): a fully read connection goes back to
        the pool, a half-read one is closed, so the upstream sees its client go away."""
        self._body = None
        self._done = True
        self._failure = None
        context, self._context = self._context, None
        if context is not None:
            await context.__aexit__(None, None, None)


_TOOL_CALLS = b'"tool_calls"'
_USAGE_OBJECT = b'"usage":{'  # the usage chunk: a dict (its usage is sanitised)
_LIMIT = "x-ratelimit-limit-requests"  # an answer reporting its request limit says this


def _chunk(target: UpstreamTarget, data: bytes) -> JSON:
    """One stream event as a chunk dict. Raises UpstreamError (bad JSON, in-band error)."""
    try:
        chunk = _decode(data)
    except msgspec.DecodeError:
        raise bad_response(target.endpoint, "a stream event is not JSON") from None
    except RecursionError:
        raise bad_response(target.endpoint, "a stream event is JSON nested too deeply") from None
    if not isinstance(chunk, dict):
        raise bad_response(target.endpoint, "a stream event is not an object")
    if "error" in chunk:
        raise _in_band_error(target, chunk["error"], data)
    return chunk


# The HTTP status an in-band error's OpenAI-style ``type`` stands for (vLLM's exception name,
# lower-cased, too); a type not here (``server_error``...) says nothing.
_ERROR_TYPES = {
    "invalid_request_error": 400,
    "badrequesterror": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "rate_limit_error": 429,
    "insufficient_quota": 429,
}


def _in_band_error(target: UpstreamTarget, err: Any, data: bytes) -> UpstreamError:
    """The UpstreamError of an in-band ``error`` event, classified by the status its ``code``
    (vLLM's ``400``, LiteLLM's ``"400"``) or its ``type`` names, as that HTTP answer would be:
    vLLM refuses an overlong prompt this way once its stream began, and without a status it
    read as "no answer", so one caller's prompts opened the route's circuit and muted its
    only key for everyone. None says nothing known (the route's failure, as before)."""
    code = err.get("code") if isinstance(err, dict) else None
    status = code if isinstance(code, int) and not isinstance(code, bool) else None
    if isinstance(code, str) and len(code) == 3 and code.isascii() and code.isdigit():
        status = int(code)  # not int() of any digits: "²" or 5,000 of them raise
    if status is None and isinstance(err, dict) and isinstance(err.get("type"), str):
        status = _ERROR_TYPES.get(err["type"].lower())
    if status is None or not 400 <= status <= 599:
        msg = err.get("message") if isinstance(err, dict) else str(err)
        return UpstreamError(
            f"upstream stream error: {msg}", endpoint=target.endpoint, kind="stream_error"
        )
    failure = error_from_status(target.endpoint, status, {}, data)
    failure.message = f"upstream stream error: {failure.message}"
    failure.args = (failure.message,)
    if failure.kind.startswith("http_"):  # a quota's kind says more than where it came
        failure.kind = "stream_error"
    return failure


def _unmarked(item: Any) -> Any:
    """``item`` without a ``cache_control`` key (a copy when it has one)."""
    if type(item) is not dict or "cache_control" not in item:
        return item
    return {k: v for k, v in item.items() if k != "cache_control"}


def _drop_cache_marks(payload: JSON) -> None:
    """Take the Messages surface's prompt-caching marks off ``payload`` (a shallow copy of
    the request: what it holds is replaced, never changed)."""
    payload.pop("cache_control", None)
    if type(payload.get("tools")) is list:
        payload["tools"] = [_unmarked(tool) for tool in payload["tools"]]
    if type(payload.get("messages")) is list:
        payload["messages"] = [_unmarked_message(m) for m in payload["messages"]]


# How the Messages surface joins a role's text blocks when no mark keeps them apart.
_TEXT_JOINS = {"assistant": "", "system": "\n\n", "tool": "\n\n"}


def _unmarked_message(message: Any) -> Any:
    """``message`` without marks, its text as the surface gives it unmarked (a string)."""
    content = message.get("content") if type(message) is dict else None
    if type(content) is not list or not any(_unmarked(p) is not p for p in content):
        return message
    parts = [_unmarked(p) for p in content]
    join = _TEXT_JOINS.get(message.get("role"), None if len(parts) > 1 else "")
    if join is not None and all(type(p) is dict and p.get("type") == "text" for p in parts):
        return {**message, "content": join.join(p.get("text") or "" for p in parts)}
    return {**message, "content": parts}


def _without_thinking(message: Any) -> Any:
    """``message`` without Claude's ``thinking_blocks`` (a copy when it has them)."""
    if type(message) is not dict or "thinking_blocks" not in message:
        return message
    return {k: v for k, v in message.items() if k != "thinking_blocks"}
