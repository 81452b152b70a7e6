"""What crosses the bus: the one wire format (msgspec JSON over the tagged union
``schemas.Message``) and the ``Envelope`` a subscriber receives a decoded message in.

The codec is pure functions, no I/O. Both buses send every message through here and deliver
it in an Envelope, so a struct that does not round-trip fails the first unit test that
publishes it. :func:`encode`, :func:`decode` and :func:`decode_reply` are the checked entry
points; a bus on a hot path may instead call the msgspec methods they wrap
(:data:`encode_message`, :data:`decode_message`, :func:`reply_decoder`: C calls, no Python
frame) if it keeps their contract: the type checked against :data:`MESSAGE_TYPES` first, and
:data:`WIRE_ERRORS` turned into CodecError by :func:`wire_error` or :func:`reply_error`.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Awaitable, Callable  # the Envelope's fields: resolved at run time
from typing import Any, TypeVar, Union

import msgspec

from schemas import ErrorReply, Message

T = TypeVar("T")

_ENCODER = msgspec.json.Encoder()
_DECODER: msgspec.json.Decoder[Message] = msgspec.json.Decoder(Message)
MESSAGE_TYPES: frozenset[type] = frozenset(typing.get_args(Message))
encode_message = _ENCODER.encode
decode_message = _DECODER.decode
# What msgspec raises on a value it cannot encode (TypeError, EncodeError) or bytes it cannot
# decode (DecodeError).
WIRE_ERRORS = (TypeError, msgspec.MsgspecError)
_SNIPPET = 120


class CodecError(ValueError):
    """Bytes are not a valid bus message, or a value is not one of ``schemas.Message``."""


def encode(msg: Message) -> bytes:
    """Serialise one bus message. Raises CodecError when ``msg`` is not a ``schemas.Message``."""
    if type(msg) not in MESSAGE_TYPES:
        raise not_a_message(msg)
    try:
        return encode_message(msg)
    except WIRE_ERRORS as exc:
        raise wire_error(msg, exc) from exc


def decode(data: bytes) -> Message:
    """Parse bytes into the ``schemas.Message`` their tag names. Raises CodecError on bad data."""
    try:
        return decode_message(data)
    except msgspec.DecodeError as exc:
        raise _decode_error(data, exc) from exc


def decode_reply(data: bytes, reply_type: type[T]) -> T | ErrorReply:
    """Parse a reply that must be ``reply_type`` or ``ErrorReply``.

    Raises CodecError on bad data or on a reply of another type, and TypeError when
    ``reply_type`` cannot be decoded by tag (not a tagged struct of ``schemas.Message``).
    """
    try:
        reply: T | ErrorReply = reply_decoder(reply_type).decode(data)
    except msgspec.DecodeError as exc:
        raise reply_error(reply_type, data, exc) from exc
    return reply


def not_a_message(value: object) -> CodecError:
    """The error for a value outside ``schemas.Message`` (the type check :func:`encode` makes)."""
    return CodecError(f"{type(value).__qualname__} is not a bus message (not in schemas.Message)")


def wire_error(msg: Message, exc: Exception) -> CodecError:
    """The CodecError for one of :data:`WIRE_ERRORS` raised encoding ``msg`` or decoding the
    bytes it encodes to."""
    if isinstance(exc, msgspec.DecodeError):
        return _decode_error(encode_message(msg), exc)
    return CodecError(f"cannot encode {type(msg).__qualname__}: {exc}")


def reply_error(reply_type: Any, data: bytes, exc: Exception) -> CodecError:
    """The CodecError for ``data`` that is no ``reply_type`` or ErrorReply."""
    return CodecError(
        f"cannot decode reply as {_name(reply_type)} | ErrorReply {data[:_SNIPPET]!r}: {exc}"
    )


def _decode_error(data: bytes, exc: Exception) -> CodecError:
    return CodecError(f"cannot decode bus message {data[:_SNIPPET]!r}: {exc}")


def _reply_decoder(reply_type: Any) -> msgspec.json.Decoder[Any]:
    try:
        return msgspec.json.Decoder(
            Union[reply_type, ErrorReply]  # noqa: UP007 - a runtime union built from a variable
        )
    except TypeError as exc:
        raise TypeError(f"cannot decode replies as {_name(reply_type)}: {exc}") from exc


# The decoder of ``reply_type | ErrorReply``, one per reply type (the set of reply types is
# small and fixed by the schemas; a cache hit is a C call). Raises TypeError when
# ``reply_type`` cannot be decoded by tag (not a tagged struct of ``schemas.Message``).
reply_decoder: Callable[[Any], msgspec.json.Decoder[Any]] = functools.cache(_reply_decoder)


def _name(tp: Any) -> str:
    return getattr(tp, "__qualname__", None) or repr(tp)


class Envelope(msgspec.Struct, eq=False):
    """One delivered message: its subject, the decoded struct, and how to answer it (a struct:
    built by msgspec's C constructor, one per message delivered).

    ``respond`` raises ``BusClosedError`` when the bus is gone; calling it on a message that
    was published (no reply subject) is a no-op.
    """

    subject: str
    message: Message
    reply: str | None
    _responder: Callable[[str, Message], Awaitable[None]] | None

    async def respond(self, msg: Message) -> None:
        """Send ``msg`` to the requester, if this envelope came from a request."""
        if self.reply is not None and self._responder is not None:
            await self._responder(self.reply, msg)

    def __repr__(self) -> str:
        return f"Envelope({self.subject!r}, {type(self.message).__name__})"
