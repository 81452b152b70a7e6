"""Reading a provider's answer in a translator (Anthropic's, Gemini's, Bedrock's, into the chat
shape): its fields checked as they are read, the error of an answer that breaks its API's
shapes, and the ids the translators give what they make."""

from __future__ import annotations

import os
from typing import Any

from schemas import UpstreamBadResponseError
from schemas.errors import UnusableAnswerError

JSON = dict[str, Any]


def new_id(prefix: str) -> str:
    """A fresh random id such as ``chatcmpl-3f2a...``."""
    return prefix + os.urandom(12).hex()


def bad_answer(what: str, *, unusable: bool = False) -> UpstreamBadResponseError:
    """The upstream's answer breaks its provider API's shapes (Anthropic's, Gemini's,
    Bedrock's: the translators share it; its ``endpoint`` is set by the adapter that
    called). ``unusable``: the model's answer had nothing to hand on (empty, or broken by a
    malformed tool call), never the route's failure (:class:`UnusableAnswerError`)."""
    error = UnusableAnswerError if unusable else UpstreamBadResponseError
    return error(f"upstream returned an invalid response: {what}", kind="bad_response")


def object_field(data: JSON, key: str, where: str) -> JSON:
    """``data[key]``, an object (absent or null: an empty one). Raises
    UpstreamBadResponseError when it is anything else."""
    value = data.get(key)
    if type(value) is dict:
        return value
    if value is None:
        return {}
    raise bad_answer(f"{where}'s {key!r} is not an object")


def text_field(data: JSON, key: str, where: str) -> str | None:
    """``data[key]``, a string or None. Raises UpstreamBadResponseError when it is neither."""
    value = data.get(key)
    if value is None or type(value) is str:
        return value
    raise bad_answer(f"{where}'s {key!r} is not a string")


def list_field(data: JSON, key: str, where: str) -> list[Any]:
    """``data[key]``, a list (absent or null: an empty one). Raises UpstreamBadResponseError
    when it is anything else."""
    value = data.get(key)
    if type(value) is list:
        return value
    if value is None:
        return []
    raise bad_answer(f"{where}'s {key!r} is not a list")
