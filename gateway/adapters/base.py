"""The adapter seam: canonical (OpenAI chat shape) requests in, canonical answers out, and
the one place what an upstream says is redacted.

Redaction: some upstreams echo the credential they were sent (``Incorrect API key: sk-…``,
``stream aborted for key Bearer sk-…``) in an error body, an in-band stream error or a 401.
Every adapter ``make_adapters`` hands out is a :class:`RedactingAdapter`, so each
``UpstreamError`` leaves the adapter seam with the attempt's key (and any ``Bearer`` token)
replaced by ``[redacted]``, before anything can answer, log, observe or publish it: plain
answers, a stream broken mid-answer, hedged twins and both background probers alike.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from gateway.adapters import upstream_status
from schemas import ErrorCode, UpstreamBadResponseError, UpstreamError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from schemas.bedrock_settings import BedrockSettings
    from schemas.config import AzureSettings

# Re-exported: the adapters and the breaker import them from here.
error_from_status = upstream_status.error_from_status
retry_after_seconds = upstream_status.retry_after_seconds
duration_seconds = upstream_status.duration_seconds
rate_limit_reset_seconds = upstream_status.rate_limit_reset_seconds
rate_limit_spent_seconds = upstream_status.rate_limit_spent_seconds

JSON = dict[str, Any]
_decode_json = msgspec.json.Decoder().decode


class Batch(list[JSON]):
    """Canonical chunks one upstream read carried, in order (never empty).

    ``last`` is True when the stream's terminator came with them: nothing follows, so the
    relay ends the client's answer in the same write. ``spent_for`` (the first batch only):
    the provider's ``x-ratelimit-remaining-*`` said a limit is spent, for this many seconds
    (:func:`rate_limit_spent_seconds`).
    """

    __slots__ = ("last", "spent_for")

    def __init__(
        self, chunks: list[JSON], *, last: bool = False, spent_for: float | None = None
    ) -> None:
        super().__init__(chunks)
        self.last = last
        self.spent_for = spent_for


_TOKEN_TEXT = ("content", "refusal", "reasoning_content", "reasoning")
"""Delta fields whose text is part of the answer: what the client reads, what the model says
when it refuses, and the reasoning text upstreams stream before it (vLLM and DeepSeek's
``reasoning_content``, OpenRouter's ``reasoning``)."""


def carries_token(chunk: JSON) -> bool:
    """Whether a canonical chunk carries part of the answer: non-empty text in a
    ``_TOKEN_TEXT`` field, a tool-call (or legacy function-call) delta, or audio. A chunk
    with only a role, an empty string, a finish reason or usage carries none."""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict):
            continue
        if any(isinstance(text := delta.get(k), str) and text for k in _TOKEN_TEXT):
            return True
        if delta.get("tool_calls") or delta.get("function_call") or delta.get("audio"):
            return True
    return False


@dataclass(frozen=True, slots=True)
class UpstreamTarget:
    """Everything an adapter needs for one attempt. ``api_key`` is the secret: never log it."""

    endpoint: str
    kind: str
    base_url: str
    upstream_model: str
    api_key: str | None
    timeout: float
    connect_timeout: float
    ttft_timeout: float = 120.0
    idle_timeout: float = 60.0
    azure: AzureSettings | None = None  # kind azure_openai: deployment, api version, token
    bedrock: BedrockSettings | None = None  # kind bedrock: region, credential profile
    trace_headers: dict[str, str] | None = None
    """The attempt's trace context (``traceparent``/``tracestate``) when telemetry is on."""

    def __repr__(self) -> str:  # keeps the secret out of any accidental log line
        return f"UpstreamTarget(endpoint={self.endpoint!r}, kind={self.kind!r})"

    def traced(self, trace_headers: dict[str, str]) -> UpstreamTarget:
        """This target carrying an attempt's trace context: ``dataclasses.replace`` built
        for every traced attempt (it costs about three times as much)."""
        return UpstreamTarget(
            self.endpoint,
            self.kind,
            self.base_url,
            self.upstream_model,
            self.api_key,
            self.timeout,
            self.connect_timeout,
            self.ttft_timeout,
            self.idle_timeout,
            self.azure,
            self.bedrock,
            trace_headers,
        )


class Adapter(Protocol):
    """Talks to one kind of upstream. Raises UpstreamError (and subclasses) on any failure."""

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        """A non-streaming chat completion, returned in the canonical chat shape."""
        ...

    def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        """Canonical ``chat.completion.chunk`` dicts in batches: each holds what one read from
        the upstream carried, so the relay sends it to the client in one write; the one that
        came with the terminator is ``last``. Raises UpstreamError if the stream breaks
        (including ending without its terminator)."""
        ...

    async def embed(self, target: UpstreamTarget, body: JSON) -> JSON:
        """An embeddings answer in the OpenAI shape."""
        ...


class UnsupportedParameterError(UpstreamError):
    """The request asks for something this route's upstream kind cannot honour as asked.

    Nothing was sent. It is a 400 naming ``param`` that does not count against the endpoint,
    so another route (of a kind that can honour it) may still serve the request.
    """

    code = ErrorCode.INVALID_REQUEST

    def __init__(self, message: str, *, endpoint: str, param: str | None = None) -> None:
        super().__init__(message, endpoint=endpoint, status=400, kind="unsupported_parameter")
        self.param = param


def json_answer(endpoint: str, body: bytes) -> Any:
    """``body`` decoded as JSON. Raises UpstreamBadResponseError when it is not JSON."""
    try:
        return _decode_json(body)
    except msgspec.DecodeError:
        raise bad_response(endpoint, "the body is not JSON") from None


def json_event(endpoint: str, data: bytes) -> JSON:
    """One streamed event's data decoded as a JSON object. Raises UpstreamBadResponseError
    when it is not JSON or not an object."""
    try:
        decoded = _decode_json(data)
    except msgspec.DecodeError:
        raise bad_response(endpoint, "a stream event is not JSON") from None
    if not isinstance(decoded, dict):
        raise bad_response(endpoint, "a stream event is not an object")
    return decoded


def bad_response(endpoint: str, what: str) -> UpstreamBadResponseError:
    """The upstream answered something that is not its API's answer."""
    return UpstreamBadResponseError(
        f"upstream returned an invalid response: {what}",
        endpoint=endpoint,
        status=None,
        kind="bad_response",
    )


# ---------------------------------------------------------------------------- redaction

REDACTED = "[redacted]"
# A bearer token the upstream repeats need not be this attempt's key (a proxy in front of
# it may hold its own): whatever follows ``Bearer`` is a credential.
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s\"',;]+")
_BEARER_BYTES = re.compile(rb"(?i)(bearer\s+)[^\s\"',;]+")


def redact(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` and every ``Bearer`` token replaced by ``[redacted]``."""
    if secret:
        text = text.replace(secret, REDACTED)
    return _BEARER.sub(rf"\g<1>{REDACTED}", text)


def redact_bytes(body: bytes, secret: str | None) -> bytes:
    """:func:`redact` for a raw upstream body."""
    if secret:
        body = body.replace(secret.encode(), REDACTED.encode())
    return _BEARER_BYTES.sub(rb"\g<1>" + REDACTED.encode(), body)


def redacted(err: UpstreamError, secret: str | None) -> UpstreamError:
    """``err`` with its message and body redacted (in place, so its type is kept)."""
    message = redact(err.message, secret)
    if message != err.message:
        err.message = message
        err.args = (message,)
    if err.body:
        err.body = redact_bytes(err.body, secret)
    return err


class MappedBatches:
    """``inner``'s batches, each UpstreamError that ends them passed through ``mapped`` (which
    returns the error to raise). Closing it closes ``inner`` at once. A class, not an async
    generator: a stream's relay pays for each layer of generator it goes through."""

    __slots__ = ("_inner", "_mapped")

    def __init__(
        self, inner: AsyncIterator[Batch], mapped: Callable[[UpstreamError], UpstreamError]
    ) -> None:
        self._inner = inner
        self._mapped = mapped

    def __aiter__(self) -> MappedBatches:
        return self

    async def __anext__(self) -> Batch:
        try:
            return await self._inner.__anext__()
        except UpstreamError as err:
            mapped = self._mapped(err)
            if mapped is err:
                raise
            raise mapped from None

    async def aclose(self) -> None:
        """Close the wrapped stream (its upstream connection goes with it)."""
        aclose = getattr(self._inner, "aclose", None)
        if aclose is not None:
            await aclose()


class RedactingAdapter:
    """Wraps one adapter; every UpstreamError it raises leaves with the attempt's
    credential redacted (see the module docstring). Raises what the wrapped adapter raises."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Adapter) -> None:
        self._inner = inner

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        """The wrapped adapter's answer."""
        try:
            return await self._inner.complete(target, body)
        except UpstreamError as err:
            redacted(err, target.api_key)
            raise

    def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        """The wrapped adapter's batches, up to the error that ends them, redacted."""
        return MappedBatches(
            self._inner.stream(target, body), functools.partial(redacted, secret=target.api_key)
        )

    async def embed(self, target: UpstreamTarget, body: JSON) -> JSON:
        """The wrapped adapter's answer."""
        try:
            return await self._inner.embed(target, body)
        except UpstreamError as err:
            redacted(err, target.api_key)
            raise
