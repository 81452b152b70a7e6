"""Canonical chat answers -> OpenAI Responses answers: the response, the SSE stream, errors.

Public names are re-exported by ``gateway.formats.openai_responses``. ``request`` arguments
take the client's original Responses body, whose settings a ``response`` echoes back
(``_responses_echo``).
"""

from __future__ import annotations

import time
from typing import Any

from gateway.formats._common import (
    JSON,
    FramesOfChunks,
    first_choice,
    frame_prefix,
    new_id,
    plain_content,
    reasoning_text,
    sse_frame,
    whole_json,
)
from gateway.formats._responses_echo import response_shell, served_tier
from gateway.formats._responses_reasoning import seal, wants_sealed
from gateway.formats._responses_tools import CALL_TEXT, call_item, streamed_item
from gateway.formats.openai_chat import error_type
from schemas.text_chunk import Chunk, chunk_json

# ResponseError.code is a closed set; anything else is reported as a server error.
_FAILURE_CODES = frozenset({"server_error", "rate_limit_exceeded", "invalid_prompt"})
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
_PREFIX: dict[str, bytes] = {}
# Per content part type: the type of the output item holding it, its delta event's name.
_ITEM_OF = {"output_text": "message", "refusal": "message", "reasoning_text": "reasoning"}
_DELTA_EVENT = {
    "output_text": "response.output_text.delta",
    "refusal": "response.refusal.delta",
    "reasoning_text": "response.reasoning_text.delta",
}
# Per tool call item type: its text's delta and done events.
_CALL_DELTA = {
    "function_call": "response.function_call_arguments.delta",
    "custom_tool_call": "response.custom_tool_call_input.delta",
}
_CALL_DONE = {
    "function_call": "response.function_call_arguments.done",
    "custom_tool_call": "response.custom_tool_call_input.done",
}


def error_body(
    status: int, message: str, param: str | None = None, *, code: str | None = None
) -> JSON:
    """OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def usage(chat_usage: Any) -> JSON | None:
    """Responses usage from chat usage (both count cached tokens inside the input total)."""
    if not isinstance(chat_usage, dict):
        return None
    prompt_details = chat_usage.get("prompt_tokens_details")
    if not isinstance(prompt_details, dict):
        prompt_details = {}
    completion_details = chat_usage.get("completion_tokens_details")
    if not isinstance(completion_details, dict):
        completion_details = {}
    prompt = chat_usage.get("prompt_tokens") or 0
    completion = chat_usage.get("completion_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": prompt_details.get("cached_tokens") or 0,
            "cache_write_tokens": prompt_details.get("cache_write_tokens") or 0,
        },
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": completion_details.get("reasoning_tokens") or 0,
        },
        "total_tokens": chat_usage.get("total_tokens") or prompt + completion,
    }


def _finalise(response: JSON, finish: Any, chat_usage: Any) -> None:
    reason = _INCOMPLETE.get(finish) if isinstance(finish, str) else None
    if reason is None:
        response["status"] = "completed"
        response["completed_at"] = int(time.time())
    else:
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": reason}
    response["usage"] = usage(chat_usage)


def _text_part(text: str) -> JSON:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _part(kind: str, text: str) -> JSON:
    """A content part of ``kind`` (a key of :data:`_ITEM_OF`) holding ``text``."""
    if kind == "output_text":
        return _text_part(text)
    if kind == "refusal":
        return {"type": "refusal", "refusal": text}
    return {"type": "reasoning_text", "text": text}


def _reasoning_item(content: list[JSON], status: str) -> JSON:
    """A ``reasoning`` output item: the upstream's reasoning text as ``reasoning_text``
    content (what OpenAI's open-weight models give), no summary (nothing wrote one). Its
    ``encrypted_content``, when the request includes it, is set by the caller: Claude's
    signed blocks (``_responses_reasoning.seal``), else null."""
    return {
        "id": new_id("rs_"),
        "type": "reasoning",
        "summary": [],
        "content": content,
        "status": status,
    }


def from_chat_response(chat: JSON, *, model: str, request: JSON | None = None) -> JSON:
    """Translate a canonical chat completion into a Responses ``response`` object.

    Raises UpstreamBadResponseError when the completion has no message.
    """
    choice, message = first_choice(chat)
    created = chat.get("created")
    response = response_shell(
        model, request, created if isinstance(created, int) else int(time.time())
    )
    if tier := served_tier(chat):
        response["service_tier"] = tier
    finish = choice.get("finish_reason")
    _finalise(response, finish, chat.get("usage"))
    item_status = "completed" if response["status"] == "completed" else "incomplete"
    if type(message.get("content")) is list:  # parts (Mistral's, say)
        message = plain_content(message)
    text = message.get("content")
    if not isinstance(text, str):
        text = ""
    refusal = message.get("refusal")
    calls = message.get("tool_calls") or []
    output: list[JSON] = []
    sealing = wants_sealed(request)
    sealed = seal(message.get("thinking_blocks")) if sealing else None
    thought = reasoning_text(message)
    if thought or sealed:  # before the answer, as OpenAI's models give it
        parts = [_part("reasoning_text", thought)] if thought else []
        output.append(_reasoning_item(parts, item_status))
        if sealing:  # Claude's blocks, all of them: each block's ``after`` places it
            output[-1]["encrypted_content"] = sealed
    if text or refusal or not calls:
        content = [_text_part(text)] if text or not refusal else []
        if refusal:
            content.append({"type": "refusal", "refusal": refusal})
        output.append(
            {
                "id": new_id("msg_"),
                "type": "message",
                "role": "assistant",
                "status": item_status,
                "content": content,
            }
        )
    output.extend(call_item(call, item_status) for call in calls)
    response["output"] = output
    return response


class ChatToResponsesStream(FramesOfChunks):
    """Turns canonical ``chat.completion.chunk`` dicts into Responses SSE events.

    ``feed`` each chunk, then exactly one of ``finish`` (clean end: ``response.completed``, or
    ``response.incomplete`` when the token limit or a content filter cut the answer) or
    ``error`` (an ``error`` event then ``response.failed``: a cut stream never looks
    complete). Reasoning goes in a ``reasoning`` item (its text as ``reasoning_text``
    content), text in a message item (reasoning coming after text opens another item of each,
    in turn); each tool call (by chat ``index``) gets its own ``function_call`` item (a
    custom tool's, a ``custom_tool_call`` streaming its ``input``), in order
    of first appearance, but one that starts while another's item is open and its arguments
    are not yet whole JSON is held, and sent at the end (servers that interleave calls still
    send the open one's fragments, which must come before its ``done`` events). When the
    request includes ``reasoning.encrypted_content``, Claude's signed blocks
    (``thinking_blocks`` deltas) are sealed into the ``encrypted_content`` of the reasoning
    item open when they came (opened for them if none is) at its ``output_item.done``.
    """

    media_type = b"text/event-stream"

    def __init__(self, model: str, *, request: JSON | None = None) -> None:
        self._response = response_shell(model, request, int(time.time()))
        self._id: str = self._response["id"]
        self._seq = 0
        self._started = False
        self._done = False
        self._items: list[JSON] = []
        self._open: JSON | None = None  # the output item being streamed
        self._part: JSON | None = None  # its open content part (not for function calls)
        self._chunks: list[str] = []  # text of the open part, or arguments of the open call
        self._calls: dict[int, tuple[int, JSON, list[str]]] = {}
        self._held: dict[int, tuple[JSON, list[str]]] = {}  # calls waiting for the open one
        self._finish: Any = None
        self._usage: Any = None
        self._sealing = wants_sealed(request)
        self._signed: list[JSON] = []  # Claude's blocks for the open reasoning item

    @property
    def done(self) -> bool:
        """True once ``finish`` or ``error`` has ended the stream."""
        return self._done

    def feed(self, typed: Chunk) -> list[bytes]:
        """Events for one chat chunk (possibly none); nothing once the stream has ended."""
        if self._done:
            return []
        chunk = chunk_json(typed)
        out: list[bytes] = []
        if not self._started:
            self._start(out)
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        if tier := served_tier(chunk):
            self._response["service_tier"] = tier
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text and type(text) is not str:  # parts (Mistral's)
                text = (delta := plain_content(delta))["content"]
            calls = delta.get("tool_calls") or ()
            if calls and self._open is not None and self._open["type"] in CALL_TEXT:
                calls = self._continued(out, calls)
            # reasoning_text's rule inline: the hot path, one chunk per token
            if thought := delta.get("reasoning_content") or delta.get("reasoning"):
                self._text(out, "reasoning_text", thought)
            if self._sealing and (signed := delta.get("thinking_blocks")):
                self._keep_signed(out, signed)
            if text:
                self._text(out, "output_text", text)
            if delta.get("refusal"):
                self._text(out, "refusal", delta["refusal"])
            for call in calls:
                if isinstance(call, dict):
                    self._tool(out, call)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return out

    def finish(self) -> list[bytes]:
        """The clean end: close open items and send the final response with usage.

        Done only once its frames are made: should making them fail, ``error`` still ends
        the stream (with ``response.failed``), as the relay then calls it."""
        if self._done:
            return []
        out: list[bytes] = []
        if not self._started:
            self._start(out)
        response = self._response
        _finalise(response, self._finish, self._usage)
        for position, (item, fragments) in self._held.items():
            self._calls[position] = (self._add_item(out, item), item, fragments)
            self._chunks = fragments
            self._arguments_delta(out, self._calls[position], "".join(fragments))
        self._close_item(out, "completed" if response["status"] == "completed" else "incomplete")
        for _, item, chunks in self._calls.values():  # fragments that came after a call closed
            item[CALL_TEXT[item["type"]]] = "".join(chunks)
        response["output"] = self._items
        self._emit(out, f"response.{response['status']}", {"response": response})
        self._done = True
        return out

    def error(
        self, message: str, code: str = "server_error", *, status: int | None = None
    ) -> list[bytes]:
        """An ``error`` event and ``response.failed`` for a stream cut mid-answer (``code``
        names the failure; ``status`` is not read)."""
        if self._done:
            return []
        self._done = True
        out: list[bytes] = []
        if not self._started:
            self._start(out)
        code = code if code in _FAILURE_CODES else "server_error"
        self._emit(out, "error", {"code": code, "message": message, "param": None})
        response = self._response
        response["status"] = "failed"
        response["error"] = {"code": code, "message": message}
        response["usage"] = usage(self._usage)
        try:
            self._keep_cut()
            response["output"] = self._items
            self._emit(out, "response.failed", {"response": response})
        except Exception:
            # What made ``finish`` fail (a gateway bug) may fail here too: the client still
            # learns that the answer failed, without what was produced of it.
            response["output"] = []
            self._emit(out, "response.failed", {"response": response})
        return out

    def _keep_cut(self) -> None:
        """Keep the open item's output so far, marked as cut."""
        if self._open is not None:
            self._open["status"] = "incomplete"
            self._seal(self._open)
            if self._part is not None:
                self._open["content"].append(self._done_part())
            elif self._open["type"] in CALL_TEXT:
                self._open[CALL_TEXT[self._open["type"]]] = "".join(self._chunks)

    def _emit(self, out: list[bytes], kind: str, payload: JSON) -> None:
        payload["type"] = kind
        payload["sequence_number"] = self._seq
        self._seq += 1
        prefix = _PREFIX.get(kind)
        if prefix is None:
            prefix = _PREFIX[kind] = frame_prefix(kind)
        out.append(sse_frame(prefix, payload))

    def _start(self, out: list[bytes]) -> None:
        self._started = True
        self._emit(out, "response.created", {"response": self._response})
        self._emit(out, "response.in_progress", {"response": self._response})

    def _add_item(self, out: list[bytes], item: JSON) -> int:
        self._close_item(out, "completed")
        index = len(self._items)
        self._items.append(item)
        self._open = item
        self._emit(out, "response.output_item.added", {"output_index": index, "item": item})
        return index

    def _close_item(self, out: list[bytes], status: str) -> None:
        item = self._open
        if item is None:
            return
        index = len(self._items) - 1
        key = CALL_TEXT.get(item["type"])
        if key is None:
            self._close_part(out)
        else:  # function_call_arguments.done {arguments}, custom_tool_call_input.done {input}
            text = item[key] = "".join(self._chunks)
            self._emit(
                out,
                _CALL_DONE[item["type"]],
                {"item_id": item["id"], "output_index": index, key: text},
            )
        item["status"] = status
        self._seal(item)
        self._emit(out, "response.output_item.done", {"output_index": index, "item": item})
        self._open = None

    def _keep_signed(self, out: list[bytes], blocks: Any) -> None:
        """Claude's signed ``blocks`` for the open reasoning item, opened if need be (a
        redacted block comes with no text)."""
        if self._open is None or self._open["type"] != "reasoning":
            self._add_item(out, _reasoning_item([], "in_progress"))
        self._signed.extend(blocks)

    def _seal(self, item: JSON) -> None:
        """A closing reasoning ``item``'s ``encrypted_content``, when the request asked."""
        if self._sealing and item["type"] == "reasoning":
            item["encrypted_content"] = seal(self._signed)
            self._signed = []

    def _done_part(self) -> JSON:
        assert self._part is not None
        return _part(self._part["type"], "".join(self._chunks))

    def _close_part(self, out: list[bytes]) -> None:
        if self._part is None or self._open is None:
            return
        part = self._done_part()
        where = {
            "item_id": self._open["id"],
            "output_index": len(self._items) - 1,
            "content_index": len(self._open["content"]),
        }
        if part["type"] == "output_text":
            self._emit(
                out, "response.output_text.done", {**where, "text": part["text"], "logprobs": []}
            )
        elif part["type"] == "refusal":
            self._emit(out, "response.refusal.done", {**where, "refusal": part["refusal"]})
        else:
            self._emit(out, "response.reasoning_text.done", {**where, "text": part["text"]})
        self._emit(out, "response.content_part.done", {**where, "part": part})
        self._open["content"].append(part)
        self._part = None

    def _text(self, out: list[bytes], kind: str, text: str) -> None:
        """``text`` on the open part of ``kind`` (a key of :data:`_ITEM_OF`), its item and
        part opened if need be."""
        if self._open is None or self._open["type"] != _ITEM_OF[kind]:
            if kind == "reasoning_text":
                self._add_item(out, _reasoning_item([], "in_progress"))
            else:
                self._add_item(
                    out,
                    {
                        "id": new_id("msg_"),
                        "type": "message",
                        "role": "assistant",
                        "status": "in_progress",
                        "content": [],
                    },
                )
        item = self._open
        assert item is not None
        where = {
            "item_id": item["id"],
            "output_index": len(self._items) - 1,
            "content_index": len(item["content"]),
        }
        if self._part is None or self._part["type"] != kind:
            self._close_part(out)
            where["content_index"] = len(item["content"])
            self._part = _part(kind, "")
            self._chunks = []
            self._emit(out, "response.content_part.added", {**where, "part": self._part})
        self._chunks.append(text)
        if kind == "output_text":
            where["logprobs"] = []
        self._emit(out, _DELTA_EVENT[kind], {**where, "delta": text})

    def _continued(self, out: list[bytes], calls: list[Any]) -> list[Any]:
        """Send the fragments of ``calls`` that continue the open call item; the others, to
        send after the delta's text. Text in the same delta opens an item, which closes the
        call's: servers that merge deltas send a call's last fragment with text."""
        rest = []
        for call in calls:
            known = self._calls.get(call.get("index", 0)) if isinstance(call, dict) else None
            if known is not None and known[1] is self._open:
                self._tool(out, call)
            else:
                rest.append(call)
        return rest

    def _tool(self, out: list[bytes], call: JSON) -> None:
        position = call.get("index", 0)
        function = call.get("function")
        if function is None and (custom := call.get("custom")) is not None:
            function, arguments = custom, custom.get("input")  # a custom (freeform) tool's
        else:
            function = function or {}
            arguments = function.get("arguments")
        known = self._calls.get(position)
        if known is None:
            held = self._held.get(position)
            if held is None:
                item = streamed_item(call, function)
                open_call = self._open is not None and self._open["type"] == "function_call"
                if self._held or (open_call and not whole_json(self._chunks)):
                    held = self._held[position] = (item, [])
            if held is not None:
                held[0]["name"] = held[0]["name"] or function.get("name") or ""
                if arguments:
                    held[1].append(arguments)
                return
            index = self._add_item(out, item)
            self._chunks = []
            known = self._calls[position] = (index, item, self._chunks)
        if arguments:
            known[2].append(arguments)
            self._arguments_delta(out, known, arguments)

    def _arguments_delta(self, out: list[bytes], call: tuple[int, JSON, Any], delta: str) -> None:
        if delta:
            self._emit(
                out,
                _CALL_DELTA[call[1]["type"]],
                {"item_id": call[1]["id"], "output_index": call[0], "delta": delta},
            )
