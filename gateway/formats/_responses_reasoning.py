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

Another upstream's reasoning text (``reasoning_content``: DeepSeek's, vLLM's), which the
item shows as ``reasoning_text`` content, goes back as it came, as its turn's
``reasoning_content`` (:func:`reasoning_texts`, :func:`give_reasoning`): DeepSeek's thinking
mode refuses a tool turn without it.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import msgspec

from gateway.formats._common import JSON, json_text, parse_json, want_dict, want_list, want_str
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


def give_reasoning(
    thought: list[JSON] | None, said: list[str], out: list[JSON]
) -> tuple[None, list[str]]:
    """Give Claude's blocks (``thinking_blocks``) and the reasoning text ``said``
    (``reasoning_content``) to the last message of ``out``, if it is an assistant's (else they
    are dropped: no turn of the model's holds them); nothing is left waiting."""
    if out and out[-1]["role"] == "assistant":
        if thought:
            out[-1].setdefault("thinking_blocks", []).extend(thought)
        if said:
            out[-1]["reasoning_content"] = "".join([out[-1].get("reasoning_content") or "", *said])
    return None, []


def reasoning_texts(item: JSON, path: str) -> list[str]:
    """A ``reasoning`` input item's ``reasoning_text`` parts' text. Raises
    InvalidRequestError naming a malformed one."""
    content = item.get("content")
    if content is None:
        return []
    texts = []
    for j, part in enumerate(want_list(content, f"{path}.content")):
        where = f"{path}.content[{j}]"
        if want_dict(part, where).get("type") == "reasoning_text":
            texts.append(want_str(part, "text", where))
    return texts
