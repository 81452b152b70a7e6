"""What the Anthropic and Bedrock request translations read out of an OpenAI chat message
the same way: its text, its tool calls with their arguments, and the call a tool message
answers. Each raises InvalidRequestError naming the field that is wrong."""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

import msgspec

from schemas import InvalidRequestError

if TYPE_CHECKING:
    from collections.abc import Callable

JSON = dict[str, Any]
_decode = msgspec.json.Decoder().decode
# Anthropic's tool_use ids and Bedrock's toolUseIds (which also caps them at 64 characters).
_WIRE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NOT_ID = re.compile(r"[^A-Za-z0-9_-]")


def wire_call_id(call_id: str) -> str:
    """``call_id`` as Anthropic and Bedrock take it: unchanged when it is already one of
    theirs, else its allowed characters and a digest of it (the same for the call and its
    result, and apart for two ids that differ). Another provider's id may not be one (Kimi's
    ``functions.get_weather:0``), and a conversation that moves to a Claude route carries it."""
    if _WIRE_ID.fullmatch(call_id):
        return call_id
    digest = hashlib.sha256(call_id.encode()).hexdigest()[:12]
    return f"{_NOT_ID.sub('_', call_id)[:40]}_{digest}".lstrip("_") or digest


def text_of(content: Any, path: str) -> str:
    """The text of a message's ``content`` (a string, or text and refusal parts joined by a
    blank line); "" for none."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(
            f"{path}.content: must be a string or an array", param=f"{path}.content"
        )
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("text", "refusal"):
            raise InvalidRequestError(
                f"{path}.content[{j}]: only text parts are allowed here",
                param=f"{path}.content[{j}]",
            )
        texts.append(part.get("text") or part.get("refusal") or "")
    return "\n\n".join(texts)


def tool_calls(msg: JSON, path: str) -> list[tuple[str, str, JSON]]:
    """An assistant message's tool calls as (call id as :func:`wire_call_id` gives it,
    function name, arguments object)."""
    calls = []
    for j, call in enumerate(msg.get("tool_calls") or ()):
        cpath = f"{path}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(call.get("id"), str):
            raise InvalidRequestError(f"{cpath}: needs an id and a function", param=cpath)
        arguments = _arguments(function.get("arguments"), f"{cpath}.function")
        calls.append((wire_call_id(call["id"]), function.get("name") or "", arguments))
    return calls


def answered_call(msg: JSON, path: str) -> str:
    """The id of the tool call a tool message answers, as :func:`wire_call_id` gives it."""
    call_id = msg.get("tool_call_id")
    if not isinstance(call_id, str):
        raise InvalidRequestError(
            f"{path}.tool_call_id: must be a string", param=f"{path}.tool_call_id"
        )
    return wire_call_id(call_id)


def _arguments(arguments: Any, path: str) -> JSON:
    if arguments is None or arguments == "":
        return {}
    try:
        value = _decode(arguments) if isinstance(arguments, str) else arguments
    except msgspec.DecodeError:
        value = None
    if not isinstance(value, dict):
        raise InvalidRequestError(
            f"{path}.arguments: must be a JSON object", param=f"{path}.arguments"
        )
    return value


def interleave(thinking: list[JSON], rest: list[JSON]) -> list[JSON]:
    """An assistant turn's blocks in Claude's order: each of ``thinking`` (whose ``after``, an
    int when present, counts the items of ``rest`` that came before it: the text, then each
    tool call) put back where it was, without its ``after``; first when it has none."""
    if not any(block.get("after") for block in thinking):  # Claude's usual turn: thinking first
        return [*thinking, *rest] if thinking else rest
    out: list[JSON] = []
    pending = iter(thinking)
    block = next(pending, None)
    for position, item in enumerate(rest):
        while block is not None and _after(block) <= position:
            out.append({k: v for k, v in block.items() if k != "after"})
            block = next(pending, None)
        out.append(item)
    while block is not None:
        out.append({k: v for k, v in block.items() if k != "after"})
        block = next(pending, None)
    return out


def _after(block: JSON) -> int:
    after = block.get("after")
    return after if type(after) is int else 0


def refuse_sampling_with_thinking(chat: JSON, thinking: Any, why: str) -> None:
    """Raise :func:`sampling_conflict`'s InvalidRequestError when ``thinking`` (a config other
    than ``disabled``; ``why`` names what turned it on) meets sampling Claude refuses then.
    Refused here, in the caller's terms, rather than sent to be refused upstream (and the next
    route tried) or changed unasked."""
    if not isinstance(thinking, dict) or thinking.get("type") == "disabled":
        return
    if (conflict := sampling_conflict(chat, why)) is not None:
        raise conflict


def sampling_conflict(chat: JSON, why: str) -> InvalidRequestError | None:
    """What in ``chat`` Claude refuses while it thinks (``why`` turns thinking on): a
    ``temperature`` other than 1, a ``top_p`` below 0.95, a ``tool_choice`` that forces a tool
    call; None when nothing."""
    temperature = chat.get("temperature")
    if temperature is not None and temperature != 1:
        return InvalidRequestError(
            f"temperature: Claude thinks only at temperature 1, and {why} turns thinking on",
            param="temperature",
        )
    top_p = chat.get("top_p")
    if isinstance(top_p, int | float) and not isinstance(top_p, bool) and top_p < 0.95:
        return InvalidRequestError(
            f"top_p: Claude thinks only with top_p from 0.95 to 1, and {why} turns thinking on",
            param="top_p",
        )
    choice = chat.get("tool_choice")
    kind = choice
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "allowed_tools":
            kind = (choice.get("allowed_tools") or {}).get("mode")
    if kind in ("required", "function"):
        return InvalidRequestError(
            f"tool_choice: Claude cannot be made to call a tool while it thinks, and {why} "
            "turns thinking on (use auto or none)",
            param="tool_choice",
        )
    return None


def join_turn(turn: list[JSON], blocks: list[JSON], thinking: Callable[[JSON], bool]) -> None:
    """Add an assistant message's ``blocks`` to the assistant ``turn`` before it (one turn sent
    as two messages: text, then tool calls). Its leading ``thinking`` blocks join the turn's,
    which Claude wants first while it thinks, rather than land mid-turn."""
    lead = next((i for i, block in enumerate(turn) if not thinking(block)), None)
    cut = next((i for i, block in enumerate(blocks) if not thinking(block)), len(blocks))
    if lead is not None and cut:
        turn[lead:lead] = blocks[:cut]
        blocks = blocks[cut:]
    turn.extend(blocks)


def signed_thinking(
    blocks: Any, thought: Callable[[str, str], JSON], redacted: Callable[[str], JSON]
) -> list[JSON]:
    """An assistant message's ``thinking_blocks`` as Claude takes them back, each made by
    ``thought(text, signature)`` or ``redacted(data)``, with the ``after`` that
    :func:`interleave` reads; an unsigned thinking block (another provider's reasoning as
    the Messages surface renders it, which Claude refuses) and other types are left out."""
    kept: list[JSON] = []
    for block in blocks if isinstance(blocks, list) else ():
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "thinking" and block.get("signature"):
            kept.append(thought(block.get("thinking") or "", block["signature"]))
        elif kind == "redacted_thinking" and block.get("data"):
            kept.append(redacted(block["data"]))
        else:
            continue
        if type(after := block.get("after")) is int and after > 0:
            kept[-1]["after"] = after
    return kept


def unsigned_tool_turn(chat: JSON) -> bool:
    """Whether ``chat``'s last assistant turn (its last run of assistant messages) calls a tool
    without Claude's signed thinking (a ``thinking_blocks`` entry :func:`signed_thinking`
    keeps). With thinking on, Claude refuses such a conversation: its final assistant turn
    must begin with the thinking that preceded its tool use."""
    messages = chat.get("messages")
    calls = signed = seen = False
    for message in reversed(messages) if type(messages) is list else ():
        if type(message) is not dict or message.get("role") != "assistant":
            if seen:
                break
            continue
        seen = True
        calls = calls or bool(message.get("tool_calls"))
        signed = signed or bool(signed_thinking(message.get("thinking_blocks"), _kept, _gone))
    return calls and not signed


def _kept(text: str, signature: str) -> JSON:
    return {}


def _gone(data: str) -> JSON:
    return {}
