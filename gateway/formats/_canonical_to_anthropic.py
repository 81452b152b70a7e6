"""Canonical chat answers -> Anthropic Messages answers: the message, the SSE stream, errors.

Reasoning becomes thinking: Claude's own blocks (a canonical ``thinking_blocks``, as the
anthropic adapter keeps them) as they came, with their real signatures, and redacted ones as
such; another provider's reasoning text (``reasoning_content``) as one thinking block whose
signature is empty (``_NO_SIGNATURE``).

Public names are re-exported by ``gateway.formats.anthropic_messages``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.formats._anthropic_errors import KNOWN_ERROR_TYPES, error_type
from gateway.formats._common import (
    JSON,
    FramesOfChunks,
    first_choice,
    frame_prefix,
    new_id,
    parse_json,
    plain_content,
    reasoning_text,
    sse_frame,
    whole_json,
)
from gateway.formats.claude_markers import CLAUDE_STOP_REASON
from schemas import UpstreamBadResponseError
from schemas.canonical_markers import START_USAGE
from schemas.text_chunk import Chunk, chunk_json

_P_MESSAGE_START = frame_prefix("message_start")
_P_BLOCK_START = frame_prefix("content_block_start")
_P_BLOCK_DELTA = frame_prefix("content_block_delta")
_P_BLOCK_STOP = frame_prefix("content_block_stop")
_P_MESSAGE_DELTA = frame_prefix("message_delta")
_P_ERROR = frame_prefix("error")
_PING = sse_frame(frame_prefix("ping"), {"type": "ping"})
_MESSAGE_STOP = sse_frame(frame_prefix("message_stop"), {"type": "message_stop"})
# A thinking block's signature is Anthropic's proof that Claude wrote it; none exists for
# another provider's reasoning, and forging one would be a lie a Claude upstream rejects. The
# SDK requires the field: an empty string, as other gateways send. A client replaying the
# block to this gateway is fine (the anthropic adapter drops unsigned thinking blocks, and no
# other upstream kind is sent any).
_NO_SIGNATURE = ""
_EMPTY_TEXT = {"type": "text", "text": ""}
_EMPTY_THINKING = {"type": "thinking", "thinking": "", "signature": _NO_SIGNATURE}


def stop_reason(finish: Any, matched: Any, has_tool_calls: bool) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` for a chat ``finish_reason``.

    ``matched`` is vLLM's ``choice.stop_reason`` (the stop string that ended the answer, when
    one did); plain OpenAI servers never say which stop sequence matched, so those answers
    report ``end_turn``. Some servers (Ollama) finish tool calls with ``stop``: tool calls win.
    """
    if finish == "length":
        return "max_tokens", None
    if finish == "content_filter":
        return "refusal", None
    if has_tool_calls or finish in ("tool_calls", "function_call"):
        return "tool_use", None
    if isinstance(matched, str):
        return "stop_sequence", matched
    return "end_turn", None


def usage(chat_usage: Any) -> JSON:
    """Anthropic usage from chat usage: Anthropic's ``input_tokens`` excludes cached tokens;
    ``cache_creation`` splits the writes by TTL when some had a 1-hour one (Claude's)."""
    if not isinstance(chat_usage, dict):
        chat_usage = {}
    details = chat_usage.get("prompt_tokens_details")
    if not isinstance(details, dict):
        details = {}
    cached = details.get("cached_tokens") or 0
    written = details.get("cache_write_tokens") or 0
    prompt = chat_usage.get("prompt_tokens") or 0
    out = {
        "input_tokens": max(prompt - cached - written, 0),
        "output_tokens": chat_usage.get("completion_tokens") or 0,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": written,
    }
    written_1h = details.get("cache_write_1h_tokens")
    if written_1h is not None:
        out["cache_creation"] = {
            "ephemeral_5m_input_tokens": max(written - written_1h, 0),
            "ephemeral_1h_input_tokens": written_1h,
        }
    return out


def _message_id(chat_id: Any) -> str:
    if isinstance(chat_id, str) and chat_id.startswith("msg_"):
        return chat_id
    return new_id("msg_")


def _tool_input(arguments: Any, finish: Any) -> JSON:
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, dict):
        return arguments
    try:
        value = parse_json(arguments) if isinstance(arguments, str) else None
    except msgspec.DecodeError:
        value = None
    if isinstance(value, dict):
        return value
    if finish == "length":
        # Cut by the token limit mid-arguments: stop_reason max_tokens already tells the
        # client the call is incomplete.
        return {}
    raise UpstreamBadResponseError(
        "upstream tool call arguments are not a JSON object", kind="bad_response"
    )


def _thinking_blocks(blocks: Any) -> list[tuple[int, JSON]]:
    """The Messages blocks of a canonical ``thinking_blocks`` (the adapter seam made it a list
    of objects with string or null fields): thinking and redacted_thinking blocks with only
    the fields the API defines, in order, each with its ``after`` (0 if none: see
    ``_interleave``); those of another type are not shown."""
    out: list[tuple[int, JSON]] = []
    for block in blocks or ():
        kind = block.get("type")
        if kind == "thinking":
            thought = block.get("thinking") or ""
            signature = block.get("signature") or ""
            shown: JSON = {"type": kind, "thinking": thought, "signature": signature}
        elif kind == "redacted_thinking":
            shown = {"type": kind, "data": block.get("data") or ""}
        else:
            continue
        after = block.get("after")
        out.append((after if type(after) is int else 0, shown))
    return out


def _interleave(thinking: list[tuple[int, JSON]], rest: list[JSON]) -> list[JSON]:
    """Claude's order: each thinking block before the others, or after as many of ``rest``
    (the text, then each tool call) as its ``after`` says, as interleaved thinking gave it."""
    out = [block for after, block in thinking if after <= 0]
    for position, item in enumerate(rest, 1):
        out.append(item)
        out += [block for after, block in thinking if after == position]
    return out + [block for after, block in thinking if after > len(rest)]


def from_chat_response(chat: JSON, *, model: str) -> JSON:
    """Translate a canonical chat completion into an Anthropic ``message``.

    Raises UpstreamBadResponseError when the completion has no message, or a tool call's
    arguments are not a JSON object (unless the answer was cut by the token limit).
    """
    choice, message = first_choice(chat)
    finish = choice.get("finish_reason")
    content: list[JSON] = []
    if type(message.get("content")) is list:  # parts (Mistral's, say)
        message = plain_content(message)
    native = _thinking_blocks(message.get("thinking_blocks"))
    if not native and (thought := reasoning_text(message)):
        content.append({"type": "thinking", "thinking": thought, "signature": _NO_SIGNATURE})
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        content.append({"type": "text", "text": refusal})
    calls = message.get("tool_calls") or []
    for call in calls:
        if not isinstance(call, dict):
            raise UpstreamBadResponseError(
                "upstream tool call is not an object", kind="bad_response"
            )
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or new_id("toolu_"),
                "name": function.get("name") or "",
                "input": _tool_input(function.get("arguments"), finish),
            }
        )
    if native:  # first, as Claude's come, but for those its interleaved thinking put later
        content = _interleave(native, content)
    reason, sequence = stop_reason(finish, choice.get("stop_reason"), bool(calls))
    if reason == "end_turn" and refusal:
        reason = "refusal"
    if type(claude := choice.get(CLAUDE_STOP_REASON)) is str:
        reason = claude  # Claude's own (pause_turn, ...): its route kept it for this client
    return {
        "id": _message_id(chat.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(chat.get("usage")),
    }


class ChatToMessagesStream(FramesOfChunks):
    """Turns canonical ``chat.completion.chunk`` dicts into Anthropic Messages SSE frames.

    ``feed`` each chunk, then exactly one of ``finish`` (the upstream ended cleanly, ``[DONE]``
    seen) or ``error`` (the stream broke: the client gets an ``error`` event and never a
    ``message_stop``). Reasoning (a ``thinking`` block), text and each tool call (by chat
    ``index``) get their own content block, opened in order of first appearance; reasoning
    after text opens a new thinking block, as Claude's interleaved thinking does. A thinking
    block's signature stays empty (``_NO_SIGNATURE``) unless a ``thinking_blocks`` delta brings
    Claude's: its ``signature_delta`` then ends the block (its text came as reasoning, and is
    only sent from the entry when no thinking block is open); a redacted_thinking entry is a
    block of its own, opened and closed at once. A tool call that starts while another's block
    is open and its arguments are not yet whole JSON is held, and sent at the end as one block
    with its arguments in one delta: servers that interleave calls (Cerebras, some vLLM
    parsers) still send fragments of the open one, and a Messages block takes no delta after
    its ``content_block_stop``.
    """

    media_type = b"text/event-stream"
    __slots__ = (
        "_claude_stop",
        "_done",
        "_finish",
        "_held",
        "_live",
        "_live_args",
        "_matched",
        "_model",
        "_next",
        "_open",
        "_open_kind",
        "_refused",
        "_started",
        "_tools",
        "_usage",
    )

    def __init__(self, model: str) -> None:
        self._model = model
        self._started = False
        self._done = False
        self._next = 0
        self._open: int | None = None
        self._open_kind: str | None = None  # "text" or "thinking": the open block takes more
        self._tools: dict[int, int] = {}
        self._live: Any = None  # the chat index of the tool call on the open block
        self._live_args: list[str] = []  # its argument fragments
        self._held: dict[Any, tuple[str, list[str], list[str]]] = {}  # id, [name], fragments
        self._finish: Any = None
        self._matched: Any = None
        self._claude_stop: Any = None  # Claude's own stop_reason, when its route kept it
        self._refused = False  # a refusal came (an ``end_turn`` then reads ``refusal``)
        self._usage: Any = None

    @property
    def done(self) -> bool:
        """True once ``finish`` or ``error`` has ended the stream."""
        return self._done

    def feed(self, typed: Chunk) -> list[bytes]:
        """Frames for one chat chunk (possibly none); nothing once the stream has ended."""
        if self._done:
            return []
        chunk = chunk_json(typed)
        out: list[bytes] = []
        if not self._started:
            self._start(out, chunk)
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text and type(text) is not str:  # parts (Mistral's)
                text = (delta := plain_content(delta))["content"]
            calls = delta.get("tool_calls") or ()
            if calls and self._live is not None:
                calls = self._continued(out, calls)
            # reasoning_text's rule inline: the hot path, one chunk per token
            if thought := delta.get("reasoning_content") or delta.get("reasoning"):
                self._block_delta(out, "thinking", thought)
            if signed := delta.get("thinking_blocks"):
                for _, block in _thinking_blocks(signed):  # in stream order: no ``after``
                    self._thinking(out, block)
            if text:
                self._block_delta(out, "text", text)
            refusal = delta.get("refusal")
            if refusal:
                self._block_delta(out, "text", refusal)
                self._refused = True
            for call in calls:
                if isinstance(call, dict):
                    self._tool(out, call)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
                self._matched = choice.get("stop_reason")
                self._claude_stop = choice.get(CLAUDE_STOP_REASON)
        return out

    def finish(self) -> list[bytes]:
        """The clean end: close the open block, ``message_delta`` and ``message_stop``.

        A stream that ended without a finish reason reports ``end_turn``.
        """
        if self._done:
            return []
        out: list[bytes] = []
        if not self._started:
            self._start(out, {})
        self._close(out)
        for position, (call_id, name, fragments) in self._held.items():
            block = {"type": "tool_use", "id": call_id, "name": name[0], "input": {}}
            self._tools[position] = self._open_block(out, block)
            self._tool_delta(out, self._tools[position], "".join(fragments))
            self._close(out)
        reason, sequence = stop_reason(self._finish, self._matched, bool(self._tools))
        if reason == "end_turn" and self._refused:  # as a whole answer says it
            reason = "refusal"
        if type(self._claude_stop) is str:
            reason = self._claude_stop
        out.append(
            sse_frame(
                _P_MESSAGE_DELTA,
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage(self._usage),
                },
            )
        )
        out.append(_MESSAGE_STOP)
        self._done = True  # only now: had making the frames failed, ``error`` still ends it
        return out

    def error(
        self, message: str, type: str = "api_error", *, status: int | None = None
    ) -> list[bytes]:
        """Anthropic's in-stream ``error`` event for a stream cut mid-answer.

        ``type`` must be an Anthropic error type; anything else is sent as ``api_error``.
        ``status``, the HTTP status the failure stands for (Claude's own in-stream
        ``overloaded_error`` is a 529), chooses the type instead, as :func:`error_type` does.
        """
        if self._done:
            return []
        self._done = True
        if status is not None:
            type = error_type(status)
        kind = type if type in KNOWN_ERROR_TYPES else "api_error"
        return [sse_frame(_P_ERROR, {"type": "error", "error": {"type": kind, "message": message}})]

    def _start(self, out: list[bytes], chunk: JSON) -> None:
        self._started = True
        start_usage = usage(chunk.get(START_USAGE) or chunk.get("usage"))
        start_usage["output_tokens"] = 0
        out.append(
            sse_frame(
                _P_MESSAGE_START,
                {
                    "type": "message_start",
                    "message": {
                        "id": _message_id(chunk.get("id")),  # Claude's, as plain
                        "type": "message",
                        "role": "assistant",
                        "model": self._model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": start_usage,
                    },
                },
            )
        )
        out.append(_PING)

    def _open_block(self, out: list[bytes], block: JSON) -> int:
        self._close(out)
        index = self._next
        self._next += 1
        self._open = index
        out.append(
            sse_frame(
                _P_BLOCK_START,
                {"type": "content_block_start", "index": index, "content_block": block},
            )
        )
        return index

    def _close(self, out: list[bytes]) -> None:
        if self._open is not None:
            out.append(
                sse_frame(_P_BLOCK_STOP, {"type": "content_block_stop", "index": self._open})
            )
            self._open = None
            self._open_kind = None
            self._live = None

    def _block_delta(self, out: list[bytes], kind: str, text: str) -> None:
        """``text`` on the open block of ``kind`` ("text" or "thinking"), opened if need be."""
        if self._open_kind != kind:
            index = self._open_block(out, _EMPTY_THINKING if kind == "thinking" else _EMPTY_TEXT)
            self._open_kind = kind
        else:
            index = self._next - 1
        if kind == "thinking":
            delta = {"type": "thinking_delta", "thinking": text}
        else:
            delta = {"type": "text_delta", "text": text}
        out.append(
            sse_frame(
                _P_BLOCK_DELTA,
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
        )

    def _thinking(self, out: list[bytes], block: JSON) -> None:
        """Claude's ``block``, whole: a redacted one on its own, a thinking one's signature
        (and its text, when no thinking block is open to have had it) on the open block."""
        if block["type"] == "redacted_thinking":
            self._open_block(out, block)
            self._close(out)
            return
        if self._open_kind != "thinking":
            self._open_block(out, _EMPTY_THINKING)
            self._open_kind = "thinking"
            if block["thinking"]:
                self._block_delta(out, "thinking", block["thinking"])
        if block["signature"]:
            delta = {"type": "signature_delta", "signature": block["signature"]}
            out.append(
                sse_frame(
                    _P_BLOCK_DELTA,
                    {"type": "content_block_delta", "index": self._next - 1, "delta": delta},
                )
            )
            self._close(out)

    def _continued(self, out: list[bytes], calls: list[Any]) -> list[Any]:
        """Send the fragments of ``calls`` that continue the call on the open block; the
        others, to send after the delta's text. Text in the same delta opens a block, which
        closes the call's: servers that merge deltas send a call's last fragment with text."""
        rest = []
        for call in calls:
            if isinstance(call, dict) and call.get("index", 0) == self._live:
                self._tool(out, call)
            else:
                rest.append(call)
        return rest

    def _tool(self, out: list[bytes], call: JSON) -> None:
        position = call.get("index", 0)
        function = call.get("function") or {}
        arguments = function.get("arguments")
        index = self._tools.get(position)
        if index is None:
            held = self._held.get(position)
            interleaving = self._live not in (None, position) and not whole_json(self._live_args)
            if held is None and (self._held or interleaving):
                held = self._held[position] = (call.get("id") or new_id("toolu_"), [""], [])
            if held is not None:
                held[1][0] = held[1][0] or function.get("name") or ""
                if arguments:
                    held[2].append(arguments)
                return
            index = self._open_block(
                out,
                {
                    "type": "tool_use",
                    "id": call.get("id") or new_id("toolu_"),
                    "name": function.get("name") or "",
                    "input": {},
                },
            )
            self._tools[position] = index
            self._live, self._live_args = position, []
        if arguments and position == self._live:
            self._live_args.append(arguments)
        self._tool_delta(out, index, arguments)

    def _tool_delta(self, out: list[bytes], index: int, arguments: Any) -> None:
        if arguments:
            out.append(
                sse_frame(
                    _P_BLOCK_DELTA,
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": arguments},
                    },
                )
            )
