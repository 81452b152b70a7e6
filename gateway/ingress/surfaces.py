"""A client surface: how one API shape's requests become canonical and answers go back.

Every chat-shaped surface (chat completions, responses, messages) is one ``Surface`` value,
so the ingress runs one routing and failover path for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from gateway.formats import anthropic_messages, openai_chat, openai_responses
from gateway.formats.client_paths import in_client_terms
from gateway.http.errors import relayed_param
from schemas import ErrorCode

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from schemas import GatewayError
    from schemas.text_chunk import Chunk

JSON = dict[str, Any]
_encode = msgspec.json.Encoder().encode


class StreamRenderer(Protocol):
    """Turns canonical chunks into this surface's SSE frames."""

    def feed(self, chunk: Chunk) -> list[bytes]: ...
    def feed_all(self, chunks: Iterable[Chunk], out: bytearray) -> None:
        """Append what ``feed`` gives each of ``chunks`` to ``out`` (a batch's frames); a
        chunk that raises leaves the frames of those before it."""
        ...

    def finish(self) -> list[bytes]: ...
    def error(self, message: str, /, *, status: int | None = None) -> list[bytes]:
        """The dialect's end for a stream cut mid-answer; ``status``: the HTTP status the
        failure stands for (an upstream's in-stream error type), when known."""
        ...


@dataclass(frozen=True, slots=True)
class Surface:
    """One client API shape. ``to_canonical`` raises InvalidRequestError; ``render`` raises
    UpstreamBadResponseError for an answer the shape cannot express.

    ``render(answer, model, request)`` and ``stream(model, request)`` get the model id the
    client asked for and the client's original body (a Responses answer echoes its settings).
    ``client_terms(request, err)`` rewrites ``err``, any error after translation, when it is a
    refusal naming a field of the canonical body, to name the client's original body's.
    """

    name: str
    to_canonical: Callable[[Any], JSON]
    render: Callable[[JSON, str, JSON], bytes]
    stream: Callable[[str, JSON], StreamRenderer]
    error_body: Callable[[int, str, str, str | None], bytes]
    client_terms: Callable[[JSON, GatewayError], None]
    relays_overload: bool = False  # an upstream's overload is Anthropic's 529 (http_status)


def _chat_error(status: int, message: str, code: str, param: str | None) -> bytes:
    return openai_chat.error_body(status, message, code=code, param=param)


def _as_it_is(request: JSON, err: GatewayError) -> None:
    return None


def _chat_stream(model: str, request: JSON) -> StreamRenderer:
    return openai_chat.ChatStream(model, usage=openai_chat.wants_usage(request))


CHAT = Surface(
    name="chat",
    to_canonical=openai_chat.upstream_request,
    render=openai_chat.render_response,
    stream=_chat_stream,
    error_body=_chat_error,
    client_terms=_as_it_is,
)


def _responses_render(chat: JSON, model: str, request: JSON) -> bytes:
    return _encode(openai_responses.from_chat_response(chat, model=model, request=request))


def _responses_stream(model: str, request: JSON) -> StreamRenderer:
    return openai_responses.ChatToResponsesStream(model, request=request)


def _responses_error(status: int, message: str, code: str, param: str | None) -> bytes:
    return _encode(openai_responses.error_body(status, message, param, code=code))


def _responses_terms(request: JSON, err: GatewayError) -> None:
    if err.code is not ErrorCode.INVALID_REQUEST:
        # An upstream's refusal naming a field of the chat request it was sent
        # (``max_tokens``): the Responses client's (``max_output_tokens``) is its ``param``. A
        # chat client gets the upstream's as it is (``client_param``).
        if (param := relayed_param(err)) is None:
            return
        err.param = param  # type: ignore[attr-defined]
    in_client_terms(err, openai_responses.origins_of(request))


RESPONSES = Surface(
    name="responses",
    to_canonical=openai_responses.to_chat_request,
    render=_responses_render,
    stream=_responses_stream,
    error_body=_responses_error,
    client_terms=_responses_terms,
)


def _messages_render(chat: JSON, model: str, request: JSON) -> bytes:
    return _encode(anthropic_messages.from_chat_response(chat, model=model))


def _messages_stream(model: str, request: JSON) -> StreamRenderer:
    return anthropic_messages.ChatToMessagesStream(model)


def _messages_error(status: int, message: str, code: str, param: str | None) -> bytes:
    # Anthropic's error shape has no code or param; the message names the field.
    return _encode(anthropic_messages.error_body(status, message))


def _messages_terms(request: JSON, err: GatewayError) -> None:
    if err.code is ErrorCode.INVALID_REQUEST:
        in_client_terms(err, anthropic_messages.origins_of(request))


MESSAGES = Surface(
    name="messages",
    to_canonical=anthropic_messages.to_chat_request,
    render=_messages_render,
    stream=_messages_stream,
    error_body=_messages_error,
    client_terms=_messages_terms,
    relays_overload=True,
)
