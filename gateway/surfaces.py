"""A client surface: how one API shape's requests become canonical and answers go back.

Every chat-shaped surface (chat completions, responses, messages) is one ``Surface`` value,
so the ingress runs one routing and failover path for all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.formats import openai_chat

JSON = dict[str, Any]


class StreamRenderer(Protocol):
    """Turns canonical chunks into this surface's SSE frames."""

    def feed(self, chunk: JSON) -> list[bytes]: ...
    def finish(self) -> list[bytes]: ...
    def error(self, message: str, kind: str = ...) -> list[bytes]: ...


@dataclass(frozen=True, slots=True)
class Surface:
    """One client API shape. ``to_canonical`` raises InvalidRequestError."""

    name: str
    to_canonical: Callable[[Any], JSON]
    render: Callable[[JSON, str], bytes]
    stream: Callable[[str], StreamRenderer]
    error_body: Callable[[int, str, str, str | None], bytes]


def _chat_error(status: int, message: str, code: str, param: str | None) -> bytes:
    return openai_chat.error_body(status, message, code=code, param=param)


CHAT = Surface(
    name="chat",
    to_canonical=openai_chat.validate_chat_request,
    render=openai_chat.render_response,
    stream=openai_chat.ChatStream,
    error_body=_chat_error,
)
