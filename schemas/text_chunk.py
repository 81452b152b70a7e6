"""A streamed chat chunk of text, decoded and checked by its type in one pass.

Most chunks of an OpenAI-compatible stream are one choice's text: a role, a piece of
content or reasoning, a finish reason. Walking each as a dict (check its shape, count its
characters, look for its first token, set its model, encode it again) was most of what a
stream cost the gateway over a whole answer. :func:`text_chunk` decodes such a chunk into a
:class:`TextChunk`, whose types are the checks (``msgspec``, in C), and gives None for any
other: an unknown field anywhere (a gateway relays fields it does not know, and a typed
decode would drop them), a tool call, a usage object, content given as parts, a second
choice, a value of another type. Those take the dict path (``adapters.base``'s checks) as
before; a :class:`TextChunk` is never less checked than a dict chunk, only cheaper.

A canonical stream chunk (:data:`Chunk`) is either. The adapters (``openai_compat``) make
them and the client surfaces (``gateway.formats``) render them, which may not import each
other: the type is defined here, for both. A field absent from the upstream's chunk stays
absent (``UNSET``), so a chunk renders with the fields it came with.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import msgspec
from msgspec import UNSET, UnsetType

JSON = dict[str, Any]

_Text = str | UnsetType | None


class TextDelta(msgspec.Struct, forbid_unknown_fields=True):
    """A choice's ``delta`` of text: the fields ``adapters.base._DELTA_TEXT`` checks, each a
    string or null (a ``content`` of parts, a tool call, audio: not a TextDelta)."""

    role: _Text = UNSET
    content: _Text = UNSET
    refusal: _Text = UNSET
    reasoning_content: _Text = UNSET
    reasoning: _Text = UNSET


class TextChoice(msgspec.Struct, forbid_unknown_fields=True):
    """The one choice (index 0, or none given) of a :class:`TextChunk`."""

    index: Literal[0] | UnsetType = UNSET
    delta: TextDelta | UnsetType | None = UNSET
    logprobs: Any = UNSET  # relayed as it came, as the dict path does
    finish_reason: _Text = UNSET
    stop_reason: Any = UNSET  # vLLM's: the stop string or token that ended it, or null


class TextChunk(msgspec.Struct, forbid_unknown_fields=True):
    """A ``chat.completion.chunk`` of text with no usage (null, or none), typed. Mutable:
    the renderer sets its ``model`` (and drops its null ``usage``) as it does a dict's."""

    id: str | UnsetType = UNSET
    object: str | UnsetType = UNSET
    created: int | UnsetType = UNSET
    model: str | UnsetType = UNSET
    service_tier: _Text = UNSET
    system_fingerprint: _Text = UNSET
    obfuscation: str | UnsetType = UNSET  # OpenAI's padding against length side channels
    provider: Any = UNSET  # OpenRouter's: the provider that served
    choices: list[TextChoice] | UnsetType = UNSET
    usage: UnsetType | None = UNSET

    def as_json(self) -> JSON:
        """This chunk as the dict the dict path would have decoded (absent fields absent):
        for a reader that walks dicts (a translating renderer, a trace)."""
        out: JSON = msgspec.to_builtins(self)
        return out

    def carries_token(self) -> bool:
        """``adapters.base.carries_token`` of this chunk: non-empty text in a delta field
        other than ``role``."""
        for choice in self.choices or ():
            delta = choice.delta
            if delta and (
                delta.content or delta.refusal or delta.reasoning_content or delta.reasoning
            ):
                return True
        return False

    def content_chars(self) -> int:
        """``formats.openai_chat.delta_chars`` of its choice: the characters of its content."""
        total = 0
        for choice in self.choices or ():
            delta = choice.delta
            if delta and delta.content:
                total += len(delta.content)
        return total

    def finish_reason(self) -> str | None:
        """Its choice's finish reason, when it has one (a non-empty string)."""
        for choice in self.choices or ():
            if choice.finish_reason:
                return choice.finish_reason
        return None


Chunk: TypeAlias = JSON | TextChunk
"""A canonical stream chunk: a dict, or a :class:`TextChunk` decoded by its type."""


def chunk_json(chunk: Chunk) -> JSON:
    """``chunk`` as a dict (a :class:`TextChunk` converted), for a reader that walks dicts."""
    return chunk if isinstance(chunk, dict) else chunk.as_json()


_decode = msgspec.json.Decoder(TextChunk).decode


def text_chunk(data: bytes) -> TextChunk | None:
    """``data`` (one stream event's JSON) as a :class:`TextChunk`, or None when it is not one
    (or not JSON at all: the dict path then says what is wrong with it)."""
    try:
        return _decode(data)
    except msgspec.DecodeError:
        return None
