"""Claude's signed thinking carried through a Responses ``reasoning`` item, and back.

A stateless Responses client keeps a turn's reasoning by sending its ``reasoning`` output
items back in the next request's ``input`` (``store: false``, ``include:
["reasoning.encrypted_content"]``). For Claude that turn must go back with its ``thinking``
blocks and their signatures (and its ``redacted_thinking`` blocks' ``data``) exactly: Claude
refuses a tool loop without them while it thinks. So, when the request's ``include`` asks for
it (as OpenAI returns ``encrypted_content`` only then), the item's ``encrypted_content`` holds
the canonical ``thinking_blocks`` it shows (:func:`seal`): ``llmgw.rs1.`` and the unpadded
base64url of their compact JSON, each block with ``type``, ``thinking`` and ``signature`` or
``data``, and ``after`` (where interleaved thinking stood in the turn). Not encrypted and
not signed: the text is the item's own ``reasoning_text``, redacted data is Anthropic's own
ciphertext, and Claude checks each signature. :func:`unseal` reads one back; another
provider's ``encrypted_content`` (OpenAI's) is not ours and carries nothing.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import msgspec

from gateway.formats._common import JSON, json_text, parse_json
from schemas import InvalidRequestError

ENCRYPTED_INCLUDE = "reasoning.encrypted_content"
_PREFIX = "llmgw.rs1."
_TEXT_KEYS = {"thinking": ("thinking", "signature"), "redacted_thinking": ("data",)}


def wants_sealed(request: JSON | None) -> bool:
    """Whether the Responses ``request`` asks for reasoning items' ``encrypted_content``."""
    include = request.get("include") if request is not None else None
    return type(include) is list and ENCRYPTED_INCLUDE in include


def seal(blocks: Any) -> str | None:
    """The ``encrypted_content`` carrying canonical ``thinking_blocks``; None when there is
    none to carry (reasoning that is not Claude's)."""
    kept = []
    for block in blocks if type(blocks) is list else ():
        keys = _keys(block)
        if keys is None:
            continue
        sealed = {"type": block["type"], **{k: block.get(k) or "" for k in keys}}
        if type(after := block.get("after")) is int and after > 0:
            sealed["after"] = after
        kept.append(sealed)
    if not kept:
        return None
    return _PREFIX + base64.urlsafe_b64encode(json_text(kept).encode()).decode().rstrip("=")


def unseal(value: Any, param: str) -> list[JSON]:
    """The canonical ``thinking_blocks`` an input item's ``encrypted_content`` carries: none
    when it is null or not ours. Raises InvalidRequestError naming ``param`` when it is not a
    string, or is ours but not as :func:`seal` makes it."""
    if value is None:
        return []
    if type(value) is not str:
        raise InvalidRequestError(f"{param}: must be a string or null", param=param)
    if not value.startswith(_PREFIX):
        return []
    encoded = value[len(_PREFIX) :]
    try:
        blocks = parse_json(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
    except (binascii.Error, ValueError, msgspec.DecodeError):
        blocks = None
    if type(blocks) is not list or not blocks or not all(_well_formed(b) for b in blocks):
        raise InvalidRequestError(
            f"{param}: not the encrypted_content this gateway returned; send it back unchanged",
            param=param,
        )
    return blocks


def _keys(block: Any) -> tuple[str, ...] | None:
    """The text keys of a thinking or redacted_thinking ``block``; None for anything else."""
    kind = block.get("type") if type(block) is dict else None
    return _TEXT_KEYS.get(kind) if type(kind) is str else None


def _well_formed(block: Any) -> bool:
    keys = _keys(block)
    if keys is None or set(block) - {"type", "after", *keys}:
        return False
    after = block.get("after", 1)
    return all(type(block.get(k)) is str for k in keys) and type(after) is int and after > 0
