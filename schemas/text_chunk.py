"""A streamed chat chunk of text, decoded and checked by its type in one pass.

Most chunks of an OpenAI-compatible stream are one choice's text: a role, a piece of
content or reasoning, a finish reason. Walking each as a dict (check its shape, count its
characters, look for its first token, set its model, encode it again) was most of what a
stream cost the gateway over a whole answer. :func:`text_chunk` decodes such a chunk into a
:class:`TextChunk`, whose types are the checks (``msgspec``, in C), and gives None for any
other: an unknown field anywhere (a gateway relays fields it does not know, and a typed
decode would drop them), a tool call, a usage object, content given as parts, a second
choice, a value of another type, a value nested too deep for the decode. Those take the
dict path (``adapters.base``'s checks) as before; a :class:`TextChunk` is never less checked
than a dict chunk, only cheaper (``tests/unit/gateway/adapters/test_text_chunks.py`` holds
the two paths to one another on many varied chunks). Its fields are what OpenAI, vLLM,
DeepSeek, OpenRouter and Groq send on a text chunk: other providers' chunks take the dict
path all along (a stream stops trying after its first that is not a TextChunk).

A canonical stream chunk (:data:`Chunk`) is either. The adapters (``openai_compat``) make
them and the client surfaces (``gateway.formats``) render them, which may not import each
other: the type is defined here, for both. A field absent from the upstream's chunk stays
absent (``UNSET``), so a chunk renders with the fields it came with.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias, final

import msgspec
from msgspec import UNSET, UnsetType
from msgspec.structs import asdict

JSON = dict[str, Any]

_Text = str | UnsetType | None


class TextDelta(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A choice's ``delta`` of text: the fields ``adapters.base._DELTA_TEXT`` checks, each a
    string or null (a ``content`` of parts, a tool call, audio: not a TextDelta)."""

    role: _Text = UNSET
    content: _Text = UNSET
    refusal: _Text = UNSET
    reasoning_content: _Text = UNSET
    reasoning: _Text = UNSET
    reasoning_details: Any = UNSET  # OpenRouter's, relayed unread as the dict path does

    def as_json(self) -> JSON:
        """The fields it came with, as a dict."""
        return {k: v for k, v in asdict(self).items() if v is not UNSET}


class TextChoice(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """The one choice (index 0, or none given) of a :class:`TextChunk`."""

    index: Literal[0] | UnsetType = UNSET
    delta: TextDelta | UnsetType | None = UNSET
    logprobs: Any = UNSET  # relayed as it came, as the dict path does
    finish_reason: _Text = UNSET
    stop_reason: Any = UNSET  # vLLM's: the stop string or token that ended it, or null
    native_finish_reason: Any = UNSET  # OpenRouter's: the provider's own

    def as_json(self) -> JSON:
        """The fields it came with, as a dict (its delta one too)."""
        out = {k: v for k, v in asdict(self).items() if v is not UNSET}
        if self.delta:
            out["delta"] = self.delta.as_json()
        return out


@final  # no subclass: the relay tells it from a dict chunk by ``type(chunk) is TextChunk``
class TextChunk(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A ``chat.completion.chunk`` of text, typed: no choice or one, and a ``usage`` null or
    absent (a usage object is the dict path's). Mutable: the renderer sets its ``model``
    (and drops its null ``usage``) as it does a dict's."""

    id: str | UnsetType = UNSET
    object: str | UnsetType = UNSET
    created: int | UnsetType = UNSET
    model: str | UnsetType = UNSET
    service_tier: _Text = UNSET
    system_fingerprint: _Text = UNSET
    obfuscation: str | UnsetType = UNSET  # OpenAI's padding against length side channels
    provider: Any = UNSET  # OpenRouter's: the provider that served
    x_groq: Any = UNSET  # Groq's request id (its usage chunk is the dict path's)
    choices: Annotated[list[TextChoice], msgspec.Meta(max_length=1)] | UnsetType = UNSET
    usage: UnsetType | None = UNSET  # null or absent only

    def as_json(self) -> JSON:
        """This chunk as the dict the dict path would have decoded (absent fields absent, a
        value of no set shape the same object): for a reader that walks dicts (a translating
        renderer, a trace). Shallow by hand: ``msgspec.to_builtins`` would walk those values
        again, and a deep one past the recursion limit."""
        out = {k: v for k, v in asdict(self).items() if v is not UNSET}
        if self.choices:
            out["choices"] = [self.choices[0].as_json()]
        return out

    def carries_token(self) -> bool:
        """``adapters.base.carries_token`` of this chunk: non-empty text in a delta field
        other than ``role``."""
        delta = self.choices[0].delta if self.choices else None
        return bool(
            delta and (delta.content or delta.refusal or delta.reasoning_content or delta.reasoning)
        )

    def content_chars(self) -> int:
        """``formats.openai_chat.delta_chars`` of its choice: the characters of its content."""
        delta = self.choices[0].delta if self.choices else None
        return len(delta.content) if delta and delta.content else 0

    def finished(self) -> str | None:
        """Why its choice stopped, when it says (a non-empty ``finish_reason``), else None."""
        reason = self.choices[0].finish_reason if self.choices else None
        return reason or None

    def noted(self) -> tuple[int, str | None]:
        """``content_chars()`` and ``finished()`` in one call: what a stream's relay notes of
        every chunk."""
        if not self.choices:
            return 0, None
        choice = self.choices[0]
        delta = choice.delta
        return len(delta.content) if delta and delta.content else 0, choice.finish_reason or None


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
    except (msgspec.DecodeError, RecursionError):
        # RecursionError: a value nested near the limit (the typed decode goes a level or two
        # deeper than the dict one, which may still take it).
        return None
