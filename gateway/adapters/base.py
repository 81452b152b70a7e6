"""The adapter seam: canonical (OpenAI chat shape) requests in, canonical answers out, and
the one place what an upstream says is redacted and checked.

Checking: every answer and stream chunk leaves the seam with its usage sanitised and its
``choices`` in shape, or as an UpstreamBadResponseError, so the renderers, the accounting,
the limits and the request log may rely on them instead of each guarding against them. A
stream chunk of text that an ``openai_compat`` adapter decoded as a ``TextChunk``
(``schemas.text_chunk``) was checked by its type as it was decoded (no usage, choice 0 only,
its text fields strings or null), which the checks below would pass.

- ``usage``: its token counts (``prompt_tokens``, ``completion_tokens``, ``total_tokens``,
  ``prompt_tokens_details.cached_tokens`` / ``cache_write_tokens`` / ``cache_write_1h_tokens``
  (the writes with a 1-hour TTL, part of ``cache_write_tokens``),
  ``completion_tokens_details.reasoning_tokens``) are integers in ``[0, MAX_TOKENS]`` or
  absent/null. A ``usage`` that breaks this (a string, a negative, a boolean, a float that
  is not whole, ``10**30``) is unknown: replaced by ``None``, as an answer that reported
  none, so the attempt is billed on the estimate. Odd bookkeeping never fails an answer.
- ``choices``: a list (or absent/null) of objects, each ``index`` (when present) an integer
  below the ``n`` choices the request asked for (1 unless it said): a stream with ``n`` 1
  has only choice 0. A whole answer has at least one choice, each with a ``message``
  object; a stream chunk's ``delta`` is an object or absent/null (Azure's asynchronous
  content filter sends choices without one: nothing of the answer). Their text fields are
  strings or null, their ``tool_calls`` lists of objects whose ``index`` is an integer,
  ``id``/``type`` strings, ``function`` an object whose ``name`` and ``arguments`` are
  strings (a ``custom`` tool's object: ``name`` and ``input``). A ``content`` may also be a
  list of part objects (the OpenAI API's ``text`` and ``refusal`` parts, Mistral's
  ``thinking``, whose ``thinking`` is a string or a list of ``text`` parts): each known
  part's text a string or null; a part of another type is relayed, unread. A
  ``thinking_blocks`` (Claude's signed thinking, as LiteLLM carries it) is a list of objects
  whose ``type``, ``thinking``, ``signature``, ``data`` are strings or null.
  Anything else is the upstream's bad response: a 502 (the next route is tried), or the
  dialect's stream error once a stream began.
- embeddings ``data``: one per input, in input order, in the encoding asked (``embeddings_answer``).

Redaction: some upstreams echo the credential they were sent (``Incorrect API key: sk-…``,
``stream aborted for key Bearer sk-…``) in an error body, an in-band stream error or a 401.
Every adapter ``make_adapters`` hands out is a :class:`RedactingAdapter`, so each
``UpstreamError`` leaves the adapter seam with the attempt's key (and any ``Bearer`` token)
replaced by ``[redacted]``, before anything can answer, log, observe or publish it: plain
answers, a stream broken mid-answer, hedged twins and both background probers alike. Its
message is then clipped to ``upstream_status.MESSAGE_MAX`` characters (:func:`sealed`: last,
after every secret was redacted, so none is cut in two before it is found).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from gateway.adapters import embeddings_answer, redaction, upstream_status
from gateway.adapters.batch import Batch as Batch  # re-exported
from schemas import ErrorCode, UpstreamBadResponseError, UpstreamError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from schemas.bedrock_settings import BedrockSettings
    from schemas.config import AzureSettings
    from schemas.text_chunk import Chunk

# Re-exported: the adapters and the breaker import them from here.
error_from_status = upstream_status.error_from_status
retry_after_seconds = upstream_status.retry_after_seconds
duration_seconds = upstream_status.duration_seconds
rate_limit_reset_seconds = upstream_status.rate_limit_reset_seconds
rate_limit_spent_seconds = upstream_status.rate_limit_spent_seconds
rate_report = upstream_status.rate_report
REDACTED = redaction.REDACTED
redact = redaction.redact
redact_bytes = redaction.redact_bytes
redacted = redaction.redacted
sealed = redaction.sealed

JSON = dict[str, Any]
_decode_json = msgspec.json.Decoder().decode


_TOKEN_TEXT = ("content", "refusal", "reasoning_content", "reasoning")
"""Delta fields whose text is part of the answer: what the client reads, what the model says
when it refuses, and the reasoning text upstreams stream before it (vLLM and DeepSeek's
``reasoning_content``, OpenRouter's ``reasoning``)."""


def carries_token(chunk: Chunk) -> bool:
    """Whether a canonical chunk carries part of the answer: non-empty text in a
    ``_TOKEN_TEXT`` field, a ``content`` of parts, a tool-call (or legacy function-call)
    delta, or audio. A chunk with only a role, an empty string, a finish reason or usage
    carries none."""
    if not isinstance(chunk, dict):
        return chunk.carries_token()
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not delta or not isinstance(delta, dict):
            continue
        for key in _TOKEN_TEXT:  # a loop, not any() of a generator: every chunk comes here
            text = delta.get(key)
            if text and isinstance(text, str):
                return True
        if type(parts := delta.get("content")) is list and parts:
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
    bedrock: BedrockSettings | None = None  # kind bedrock: region, credentials, model family
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
    """``body`` decoded as JSON. Raises UpstreamBadResponseError when it is not JSON (or
    nested past what a decode takes)."""
    try:
        return _decode_json(body)
    except msgspec.DecodeError:
        raise bad_response(endpoint, "the body is not JSON") from None
    except RecursionError:  # the upstream's, not the request's (dispatch reads one so)
        raise bad_response(endpoint, "the body is JSON nested too deeply") from None


def json_event(endpoint: str, data: bytes) -> JSON:
    """One streamed event's data decoded as a JSON object. Raises UpstreamBadResponseError
    when it is not JSON or not an object."""
    try:
        decoded = _decode_json(data)
    except msgspec.DecodeError:
        raise bad_response(endpoint, "a stream event is not JSON") from None
    except RecursionError:
        raise bad_response(endpoint, "a stream event is JSON nested too deeply") from None
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


# ---------------------------------------------------------------------------- checking
# The docstring's shapes, here so a request's path crosses no more files (architecture tests).

MAX_TOKENS = 10**12
"""No answer uses more tokens: a count above it is nonsense (and must not reach a 64-bit
database column or a spend total)."""

_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")
_DETAILS = {
    "prompt_tokens_details": ("cached_tokens", "cache_write_tokens", "cache_write_1h_tokens"),
    "completion_tokens_details": ("reasoning_tokens",),
}
_DETAILS_ITEMS = tuple(_DETAILS.items())
_DELTA_TEXT = frozenset({"role", "content", "refusal", "reasoning_content", "reasoning"})
# A tool call's function, or custom (freeform) tool, and its fields that must be strings.
_CALLED = (("function", ("name", "arguments")), ("custom", ("name", "input")))


def _sane_counts(counts: JSON, keys: tuple[str, ...]) -> bool:
    """Whether each of ``keys`` in ``counts`` is absent, null or a count in ``[0,
    MAX_TOKENS]`` (a bool's type is bool, not int: no count); whole floats (``12.0``) become
    ints on the way, so sums and the log see integers."""
    for key in keys:
        value = counts.get(key)
        if type(value) is int:
            if not 0 <= value <= MAX_TOKENS:
                return False
        elif value is None:
            continue
        elif isinstance(value, float) and value.is_integer() and 0 <= value <= MAX_TOKENS:
            counts[key] = int(value)
        else:
            return False
    return True


def sanitise_usage(body: JSON) -> None:
    """Replace ``body["usage"]`` by None when its counts are not sane (in place), in one
    pass over them."""
    usage = body.get("usage")
    if usage is None:
        return
    if type(usage) is not dict or not _sane_counts(usage, _COUNTS):
        body["usage"] = None
        return
    for name, keys in _DETAILS_ITEMS:
        details = usage.get(name)
        if details is not None and (type(details) is not dict or not _sane_counts(details, keys)):
            body["usage"] = None
            return


def choices_asked(body: JSON) -> int:
    """How many choices a canonical request asks for (its ``n``; 1 when it says none)."""
    n = body.get("n")
    return n if type(n) is int and n > 0 else 1


def answer_problem(body: JSON, n: int = 1) -> str | None:
    """Sanitise the usage of ``body`` (a non-streamed answer to a request for ``n`` choices)
    in place; how its ``choices`` break the shapes in the module docstring (none, a
    ``message`` not an object, ...), or None."""
    problem = _choices_problem(body, "message", _delta_problem, n)
    if problem is not None:
        return problem
    choices = body.get("choices")
    if not choices:  # the OpenAI API's answer has one per n (ChatCompletion.choices)
        return "the answer has no choice"
    for choice in choices:
        if choice.get("message") is None:
            return "a choice has no 'message'"
    return None


def _tool_call_problem(call: Any) -> str | None:
    if type(call) is not dict:
        return "a tool call is not an object"
    index = call.get("index")
    if index is not None and type(index) is not int:
        return "a tool call's 'index' is not an integer"
    for key in ("id", "type"):
        if (value := call.get(key)) is not None and type(value) is not str:
            return f"a tool call's {key!r} is not a string"
    for field, keys in _CALLED:
        if (called := call.get(field)) is None:
            continue
        if type(called) is not dict:
            return f"a tool call's {field!r} is not an object"
        for key in keys:
            if (value := called.get(key)) is not None and type(value) is not str:
                return f"a tool call's {field} {key!r} is not a string"
    return None


def _delta_problem(delta: JSON) -> str | None:
    """What is wrong with a stream chunk's ``delta`` or a whole answer's ``message`` (the
    same fields), or None. A ``content`` may also be an array of parts (a message's)."""
    # Its own keys (one or two, usually), not every text key it might have.
    for key, value in delta.items():
        if value is None:
            continue
        if key == "tool_calls":
            if type(value) is not list:
                return "'tool_calls' is not a list"
            for call in value:
                if (problem := _tool_call_problem(call)) is not None:
                    return problem
        elif type(value) is not str and key in _DELTA_TEXT:
            if key != "content" or type(value) is not list:
                return f"a {key!r} is not a string"
            if (problem := _parts_problem(value)) is not None:
                return problem
        elif key == "thinking_blocks" and (problem := _thinking_problem(value)) is not None:
            return problem
    return None


def _thinking_problem(blocks: Any) -> str | None:
    if type(blocks) is not list or any(type(block) is not dict for block in blocks):
        return "'thinking_blocks' is not a list of objects"
    for key in ("type", "thinking", "signature", "data"):
        if any(type(block.get(key)) not in (str, type(None)) for block in blocks):
            return f"a thinking block's {key!r} is not a string"
    return None


def _parts_problem(parts: list[Any], inner: bool = False) -> str | None:
    """What is wrong with a ``content`` given as parts (or, ``inner``, with the parts of a
    ``thinking`` part), or None. Only a list pays for this: a string never comes here."""
    for part in parts:
        if type(part) is not dict:
            return "a content part is not an object"
        kind = part.get("type")
        if kind == "text" or (kind == "refusal" and not inner):
            if (text := part.get(kind)) is not None and type(text) is not str:
                return f"a {kind!r} content part's {kind!r} is not a string"
        elif kind == "thinking" and not inner:
            thinking = part.get("thinking")
            if type(thinking) is list:
                if (problem := _parts_problem(thinking, inner=True)) is not None:
                    return problem
            elif thinking is not None and type(thinking) is not str:
                return "a 'thinking' content part's 'thinking' is not a string or a list"
    return None


def chunk_problem(chunk: JSON, n: int = 1) -> str | None:
    """Sanitise the usage of ``chunk`` (one streamed ``chat.completion.chunk`` of a request
    for ``n`` choices) in place; how its ``choices`` break the shapes in the module
    docstring, or None."""
    return _choices_problem(chunk, "delta", _delta_problem, n)


def _choices_problem(
    body: JSON, part: str, part_problem: Callable[[JSON], str | None], n: int
) -> str | None:
    if body.get("usage") is not None:  # a stream's chunks carry null but for the last
        sanitise_usage(body)
    choices = body.get("choices")
    if choices is None:
        return None
    if type(choices) is not list:
        return "'choices' is not a list"
    for choice in choices:
        if type(choice) is not dict:
            return "a choice is not an object"
        # A choice the client's shape has no place for was silently dropped from it. (The
        # usual 0 is settled by the first test; False reads as 0 to the renderers too.)
        index = choice.get("index")
        if index != 0 and index is not None and (type(index) is not int or not 0 < index < n):
            return f"a choice's 'index' is not one of the {n} asked for"
        reason = choice.get("finish_reason")
        if reason is not None and type(reason) is not str:
            return "a choice's 'finish_reason' is not a string"
        inner = choice.get(part)
        if inner is not None:
            if type(inner) is not dict:
                return f"a choice's {part!r} is not an object"
            if (problem := part_problem(inner)) is not None:
                return problem
    return None


class MappedBatches:
    """``inner``'s batches, each UpstreamError that ends them passed through ``mapped`` (which
    returns the error to raise); with ``checked_for`` (an endpoint), each chunk checked
    (:func:`chunk_problem`, for ``choices`` asked): the chunks before a bad one are given, then an
    UpstreamBadResponseError. Closing it closes ``inner`` at once. A class, not an async
    generator: a stream's relay pays for each layer of generator it goes through."""

    __slots__ = ("_checked_for", "_choices", "_failure", "_inner", "_mapped")

    def __init__(
        self,
        inner: AsyncIterator[Batch],
        mapped: Callable[[UpstreamError], UpstreamError],
        checked_for: str | None = None,
        choices: int = 1,
    ) -> None:
        self._inner = inner
        self._mapped = mapped
        self._checked_for = checked_for
        self._choices = choices
        self._failure: UpstreamError | None = None  # raised after the chunks before it

    def __aiter__(self) -> MappedBatches:
        return self

    async def __anext__(self) -> Batch:
        if self._failure is not None:
            raise self._failure
        try:
            batch = await self._inner.__anext__()
        except UpstreamError as err:
            mapped = self._mapped(err)
            if mapped is err:
                raise
            raise mapped from None
        if self._checked_for is not None:
            for i, chunk in enumerate(batch):
                if not isinstance(chunk, dict):  # a TextChunk: checked by its type
                    continue
                if (problem := chunk_problem(chunk, self._choices)) is not None:
                    failure = bad_response(self._checked_for, problem)
                    if i == 0:
                        raise failure
                    self._failure = failure
                    return Batch(batch[:i], spent_for=batch.spent_for, rate=batch.rate)
        return batch

    async def aclose(self) -> None:
        """Close the wrapped stream (its upstream connection goes with it)."""
        aclose = getattr(self._inner, "aclose", None)
        if aclose is not None:
            await aclose()


class RedactingAdapter:
    """Wraps one adapter; every UpstreamError it raises leaves with the attempt's
    credential redacted, every answer and chunk checked (see the module docstring). Raises
    what the wrapped adapter raises, and UpstreamBadResponseError for a misshapen answer."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Adapter) -> None:
        self._inner = inner

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        """The wrapped adapter's answer, checked."""
        try:
            answer = await self._inner.complete(target, body)
        except UpstreamError as err:
            sealed(err, target.api_key)
            raise
        if (problem := answer_problem(answer, choices_asked(body))) is not None:
            raise bad_response(target.endpoint, problem)
        return answer

    def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        """The wrapped adapter's batches, checked, up to the error that ends them, redacted."""
        return MappedBatches(
            self._inner.stream(target, body),
            functools.partial(sealed, secret=target.api_key),
            checked_for=target.endpoint,
            choices=choices_asked(body),
        )

    async def embed(self, target: UpstreamTarget, body: JSON) -> JSON:
        """The wrapped adapter's answer, its usage sanitised, its ``data`` in input order and
        in the encoding asked (``embeddings_answer``)."""
        try:
            answer = await self._inner.embed(target, body)
        except UpstreamError as err:
            sealed(err, target.api_key)
            raise
        sanitise_usage(answer)
        if (problem := embeddings_answer.answer_problem(answer, body)) is not None:
            raise bad_response(target.endpoint, problem)
        return answer
