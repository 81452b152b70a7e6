"""Helpers shared by the client formats: JSON text, SSE framing, id minting, the ``want_*``
checks of one field. The documented fields' types (``Kind``, ``check_types``) live with the
canonical shape, ``gateway.formats.openai_chat``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import msgspec

from schemas import InvalidRequestError, UpstreamBadResponseError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from schemas.text_chunk import Chunk

JSON = dict[str, Any]

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
_END = b"\n\n"


class FramesOfChunks:
    """A stream renderer's :meth:`feed_all` made of its own ``feed``: the frames of a batch
    of chunks appended to one buffer (``openai_chat.ChatStream`` encodes them into it)."""

    __slots__ = ()

    def feed(self, chunk: Chunk) -> list[bytes]:
        """The frames of ``chunk`` (the renderer's own)."""
        raise NotImplementedError

    def feed_all(self, chunks: Iterable[Chunk], out: bytearray) -> None:
        """Append what :meth:`feed` gives each of ``chunks`` to ``out`` (a chunk that raises
        leaves the frames of those before it)."""
        for chunk in chunks:
            for frame in self.feed(chunk):
                out += frame


def first_choice(chat: JSON) -> tuple[JSON, JSON]:
    """A canonical chat completion's first choice and its message. Raises
    UpstreamBadResponseError when it has none."""
    choices = chat.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise UpstreamBadResponseError("upstream answer has no choices", kind="bad_response")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise UpstreamBadResponseError("upstream choice has no message", kind="bad_response")
    return choice, message


def plain_content(message: JSON) -> JSON:
    """A canonical ``message`` or ``delta`` whose ``content`` is a list of parts, as the
    translating surfaces read it: a copy whose ``content`` is its ``text`` parts joined, with
    its ``refusal`` parts added to ``refusal`` and Mistral's ``thinking`` parts (reasoning)
    to ``reasoning_content``, the canonical reasoning channel. A part of another type (an
    image, a reference) has no place in those surfaces' text: it is not shown. The adapter
    seam has refused a list holding anything but objects (``adapters.base``); this still
    never raises. The chat surface relays the parts as the upstream sent them."""
    text: list[str] = []
    refusal: list[str] = []
    reasoning: list[str] = []
    for part in message["content"]:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            _add(text, part.get("text"))
        elif kind == "refusal":
            _add(refusal, part.get("refusal"))
        elif kind == "thinking":
            thinking = part.get("thinking")
            if isinstance(thinking, list):
                for inner in thinking:
                    if isinstance(inner, dict) and inner.get("type") == "text":
                        _add(reasoning, inner.get("text"))
            else:
                _add(reasoning, thinking)
    plain = dict(message)
    plain["content"] = "".join(text)
    for key, found in (("refusal", refusal), ("reasoning_content", reasoning)):
        if found:
            before = plain.get(key)
            plain[key] = (before if isinstance(before, str) else "") + "".join(found)
    return plain


def reasoning_text(message: JSON) -> str | None:
    """The reasoning of a canonical ``message`` or ``delta`` (parts already made plain):
    ``reasoning_content`` (vLLM, DeepSeek, and where every adapter puts Gemini's thoughts
    and Bedrock's ``reasoningContent``), else OpenRouter's ``reasoning``; None when it has
    none. Never both: servers moving from one name to the other send the same text under
    each. The adapter seam has made both strings or null; this never raises."""
    text = message.get("reasoning_content") or message.get("reasoning")
    return text if type(text) is str else None


def _add(texts: list[str], text: Any) -> None:
    if isinstance(text, str):
        texts.append(text)


def json_text(value: Any) -> str:
    """``value`` as compact JSON text."""
    return _encoder.encode(value).decode()


def parse_json(text: str | bytes) -> Any:
    """Decode JSON text. Raises msgspec.DecodeError."""
    return _decoder.decode(text)


def whole_json(fragments: list[str]) -> bool:
    """Whether a streamed tool call's argument ``fragments`` already make a JSON value (its
    last one came, as when a server streams its calls one after the other)."""
    try:
        _decoder.decode("".join(fragments))
    except msgspec.DecodeError:
        return False
    return True


def frame_prefix(event: str) -> bytes:
    """The constant head of an SSE frame for ``event``; pass it to :func:`sse_frame`."""
    return b"event: " + event.encode() + b"\ndata: "


def sse_frame(prefix: bytes, data: JSON) -> bytes:
    """One SSE frame: ``prefix`` (from :func:`frame_prefix`), the JSON of ``data``, a blank line."""
    return b"".join((prefix, _encoder.encode(data), _END))


def new_id(prefix: str) -> str:
    """A fresh random id such as ``msg_3f2a...`` (24 hex digits after ``prefix``)."""
    return prefix + os.urandom(12).hex()


def want_dict(value: Any, param: str) -> JSON:
    """``value`` if it is an object. Raises InvalidRequestError naming ``param``."""
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{param}: must be an object", param=param)
    return value


def want_list(value: Any, param: str) -> list[Any]:
    """``value`` if it is an array. Raises InvalidRequestError naming ``param``."""
    if not isinstance(value, list):
        raise InvalidRequestError(f"{param}: must be an array", param=param)
    return value


def want_str(obj: JSON, key: str, path: str) -> str:
    """``obj[key]`` if it is a string. Raises InvalidRequestError naming ``path.key``."""
    value = obj.get(key)
    if not isinstance(value, str):
        param = f"{path}.{key}" if path else key
        raise InvalidRequestError(f"{param}: must be a string", param=param)
    return value


def want_number(body: JSON, key: str) -> float | int | None:
    """``body[key]`` if it is a number or absent/null. Raises InvalidRequestError."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(f"{key}: must be a number", param=key)
    return value


def want_positive_int(body: JSON, key: str) -> int | None:
    """``body[key]`` if it is an integer >= 1 or absent/null. Raises InvalidRequestError."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequestError(f"{key}: must be an integer >= 1", param=key)
    return value


def append_system(messages: list[JSON], text: str) -> None:
    """Append a system message, merged into the previous one when that is also a system
    message: some servers' chat templates reject more than one leading system message."""
    if not text:
        return
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "system" and isinstance(last["content"], str):
        last["content"] = last["content"] + "\n\n" + text
    else:
        messages.append({"role": "system", "content": text})
