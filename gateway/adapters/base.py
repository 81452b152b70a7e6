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
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from schemas import QUOTA_EXHAUSTED, ErrorCode, UpstreamBadResponseError, UpstreamError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

    from schemas.bedrock_settings import BedrockSettings
    from schemas.config import AzureSettings

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


def _wait_hint(seconds: float | None) -> float | None:
    """A provider's wait as a hint: a positive, finite number of seconds; None for anything
    else. ``0`` or less says nothing usable: a request that took it at its word would send
    the refused request again at once, as often as its attempts allow (the refusal is still
    back-pressure: the caller's own backoff applies). NaN and infinity are malformed."""
    if seconds is None or not 0.0 < seconds < math.inf:
        return None
    return seconds


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The ``Retry-After`` header in seconds (delta form) when it asks for a wait, or None."""
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return _wait_hint(float(value))
    except ValueError:
        return None


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(value: str) -> float | None:
    """Seconds from a Go-style duration as OpenAI's ``x-ratelimit-reset-*`` headers send it
    (``"1s"``, ``"6m0s"``, ``"20ms"``, ``"1h2m3.5s"``) or a bare number of seconds; None when
    it is neither."""
    text = value.strip().lower()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    total, pos = 0.0, 0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    return total if pos == len(text) and pos > 0 else None


def rate_limit_reset_seconds(headers: Mapping[str, str]) -> float | None:
    """How long a 429 asks the caller to wait: ``Retry-After``, else ``retry-after-ms``, else
    the ``x-ratelimit-reset-*`` header of the limit that ran out (``x-ratelimit-remaining-*``
    at 0; when none says so, the shortest reset given). None when the answer says nothing,
    or no wait (0 or less) or a malformed one (:func:`_wait_hint`)."""
    after = retry_after_seconds(headers)
    if after is not None:
        return after
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            after = _wait_hint(float(ms) / 1000.0)
        except ValueError:
            pass
        if after is not None:
            return after
    resets: dict[str, float] = {}
    for limit in ("requests", "tokens"):
        raw = headers.get(f"x-ratelimit-reset-{limit}")
        seconds = duration_seconds(raw) if raw is not None else None
        if seconds is not None:
            resets[limit] = seconds
    spent = [
        s for limit, s in resets.items() if headers.get(f"x-ratelimit-remaining-{limit}") == "0"
    ]
    if spent:
        return _wait_hint(max(spent))
    return _wait_hint(min(resets.values())) if resets else None


def rate_limit_spent_seconds(headers: Mapping[str, str]) -> float | None:
    """How long a successful answer's provider will refuse the next request: a limit whose
    ``x-ratelimit-remaining-*`` is 0, until its ``x-ratelimit-reset-*`` (a second when that
    says nothing); None when no limit is spent (or the provider sends no such headers)."""
    spent: list[float] = []
    for limit in ("requests", "tokens"):
        remaining = headers.get(f"x-ratelimit-remaining-{limit}")
        if remaining is None or remaining.strip() != "0":
            continue
        raw = headers.get(f"x-ratelimit-reset-{limit}")
        seconds = duration_seconds(raw) if raw is not None else None
        spent.append(1.0 if seconds is None else seconds)
    return max(spent) if spent else None


# A 429 that says the account is out of money or quota, not that it goes too fast: the key is
# muted like any key-specific failure instead of cooling for seconds.
_QUOTA_MARKERS = (
    b"insufficient_quota",
    b"exceeded your current quota",
    b"billing_hard_limit",
    b"billing_not_active",
    b"credit balance",
)


def error_from_status(
    endpoint: str, status: int, headers: Mapping[str, str], body: bytes
) -> UpstreamError:
    """An UpstreamError for a non-2xx answer, keeping the upstream's message when it has one.

    A 429 carries when to come back (:func:`rate_limit_reset_seconds`); one that says a quota
    or the billing is exhausted has kind :data:`schemas.QUOTA_EXHAUSTED`."""
    message = _upstream_message(body) or f"upstream answered HTTP {status}"
    kind = f"http_{status}"
    if status == 429:
        retry_after = rate_limit_reset_seconds(headers)
        lowered = body.lower()
        if any(marker in lowered for marker in _QUOTA_MARKERS):
            kind = QUOTA_EXHAUSTED
    else:
        retry_after = retry_after_seconds(headers)
    return UpstreamError(
        message,
        endpoint=endpoint,
        status=status,
        body=body,
        retry_after=retry_after,
        kind=kind,
    )


def _upstream_message(body: bytes) -> str | None:
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if isinstance(data.get("message"), str):
            return str(data["message"])
    return None


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
