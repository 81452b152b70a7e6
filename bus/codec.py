"""What crosses the bus: the one wire format (msgspec JSON over the tagged union
``schemas.Message``) and the ``Envelope`` a subscriber receives a decoded message in.

The codec is pure functions, no I/O. Both buses send every message through here and deliver
it in an Envelope, so a struct that does not round-trip fails the first unit test that
publishes it.
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Any, TypeVar, Union

import msgspec

from schemas import ErrorReply, Message

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

T = TypeVar("T")

_ENCODER = msgspec.json.Encoder()
_DECODER: msgspec.json.Decoder[Message] = msgspec.json.Decoder(Message)
_MESSAGE_TYPES: frozenset[type] = frozenset(typing.get_args(Message))
# One decoder per reply type; the set of reply types is small and fixed by the schemas.
_REPLY_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {}
_SNIPPET = 120


class CodecError(ValueError):
    """Bytes are not a valid bus message, or a value is not one of ``schemas.Message``."""


def encode(msg: Message) -> bytes:
    """Serialise one bus message. Raises CodecError when ``msg`` is not a ``schemas.Message``."""
    if type(msg) not in _MESSAGE_TYPES:
        raise CodecError(f"{type(msg).__qualname__} is not a bus message (not in schemas.Message)")
    try:
        return _ENCODER.encode(msg)
    except (TypeError, msgspec.EncodeError) as exc:
        raise CodecError(f"cannot encode {type(msg).__qualname__}: {exc}") from exc


def decode(data: bytes) -> Message:
    """Parse bytes into the ``schemas.Message`` their tag names. Raises CodecError on bad data."""
    try:
        return _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise CodecError(f"cannot decode bus message {data[:_SNIPPET]!r}: {exc}") from exc


def decode_reply(data: bytes, reply_type: type[T]) -> T | ErrorReply:
    """Parse a reply that must be ``reply_type`` or ``ErrorReply``.

    Raises CodecError on bad data or on a reply of another type, and TypeError when
    ``reply_type`` cannot be decoded by tag (not a tagged struct of ``schemas.Message``).
    """
    decoder = _REPLY_DECODERS.get(reply_type)
    if decoder is None:
        decoder = _reply_decoder(reply_type)
    try:
        reply: T | ErrorReply = decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CodecError(
            f"cannot decode reply as {_name(reply_type)} | ErrorReply {data[:_SNIPPET]!r}: {exc}"
        ) from exc
    return reply


def _reply_decoder(reply_type: Any) -> msgspec.json.Decoder[Any]:
    try:
        decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(
            Union[reply_type, ErrorReply]  # noqa: UP007 - a runtime union built from a variable
        )
    except TypeError as exc:
        raise TypeError(f"cannot decode replies as {_name(reply_type)}: {exc}") from exc
    _REPLY_DECODERS[reply_type] = decoder
    return decoder


def _name(tp: Any) -> str:
    return getattr(tp, "__qualname__", None) or repr(tp)


class Envelope:
    """One delivered message: its subject, the decoded struct, and how to answer it.

    ``respond`` raises ``BusClosedError`` when the bus is gone; calling it on a message that
    was published (no reply subject) is a no-op.
    """

    __slots__ = ("_responder", "message", "reply", "subject")

    def __init__(
        self,
        subject: str,
        message: Message,
        reply: str | None,
        responder: Callable[[str, Message], Awaitable[None]] | None,
    ) -> None:
        self.subject = subject
        self.message = message
        self.reply = reply
        self._responder = responder

    async def respond(self, msg: Message) -> None:
        """Send ``msg`` to the requester, if this envelope came from a request."""
        if self.reply is not None and self._responder is not None:
            await self._responder(self.reply, msg)

    def __repr__(self) -> str:
        return f"Envelope({self.subject!r}, {type(self.message).__name__})"
