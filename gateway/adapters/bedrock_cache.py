"""Prompt caching on Bedrock Converse (pure): chat ``cache_control`` marks as ``cachePoint``s.

A mark sits where LiteLLM carries it on chat (a content part, a tool, the request: what the
Messages surface keeps of a client's Anthropic marks); Converse marks the end of a cached
prefix with a ``cachePoint`` block (botocore's ``CachePointBlock``: ``type`` ``default``, an
optional ``ttl`` of ``5m`` or ``1h``) right after what it caches: a content block, a system
block, a tool. :mod:`gateway.adapters.bedrock_wire` places them, for Claude only.
"""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]

_TTLS = frozenset({"5m", "1h"})


def points(item: Any, caching: bool = True) -> list[JSON]:
    """``[cachePoint]`` for a chat ``item`` (a part, a tool, the request) marked with a
    ``cache_control`` object, its ``ttl`` kept when Converse takes it; ``[]`` for an
    unmarked one, or when not ``caching``."""
    mark = item.get("cache_control") if caching and type(item) is dict else None
    if type(mark) is not dict:
        return []
    point: JSON = {"type": "default"}
    if mark.get("ttl") in _TTLS:
        point["ttl"] = mark["ttl"]
    return [{"cachePoint": point}]


def last_points(content: Any, caching: bool) -> list[JSON]:
    """:func:`points` of the last marked part of a message's ``content`` (for a block made
    of all its parts: a tool result, an assistant's text)."""
    found: list[JSON] = []
    for part in content if caching and type(content) is list else ():
        found = points(part) or found
    return found


def system_blocks(content: Any, text: str, caching: bool) -> list[JSON]:
    """A system message's ``SystemContentBlock``s: its ``text`` (``content``'s, joined) as
    one, or, when a part is marked and ``caching``, one per text part, each marked one
    followed by its ``cachePoint``."""
    if not last_points(content, caching):
        return [{"text": text}] if text else []
    blocks: list[JSON] = []
    for part in content:  # text parts only: ``text`` was read from them (text_of)
        if part.get("text"):
            blocks += [{"text": part["text"]}, *points(part)]
    return blocks


def mark_request(chat: JSON, messages: list[JSON], caching: bool) -> None:
    """The request's own mark (Anthropic's automatic caching: up to the last block) as a
    ``cachePoint`` ending the last message, unless one ends it already."""
    point = points(chat, caching)
    if point and messages and "cachePoint" not in messages[-1]["content"][-1]:
        messages[-1]["content"] += point
