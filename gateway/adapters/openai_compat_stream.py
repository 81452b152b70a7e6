"""What an ``openai_compat`` stream's adapter makes of a server that streams otherwise than
OpenAI does: a whole completion answered to a stream request (:func:`as_sse`, the chunks it
would have streamed), and tool calls all sent at one index or at none (:class:`CallNumbers`,
each call numbered as OpenAI numbers them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.adapters.base import JSON, UpstreamTarget, bad_response, json_answer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

_encode = msgspec.json.Encoder().encode


async def once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def as_sse(target: UpstreamTarget, body: bytes) -> bytes:
    """A whole chat completion as the SSE stream equivalent to it, ``[DONE]`` included: per
    choice a chunk with its role, content and tool calls (numbered), then one with its finish
    reason; then the usage chunk when it has usage. Raises UpstreamBadResponseError when
    ``body`` is not a completion (not JSON, no ``choices`` list)."""
    answer = json_answer(target.endpoint, body)
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if type(choices) is not list:
        raise bad_response(target.endpoint, "the JSON answer to a stream has no 'choices'")
    head = {k: answer[k] for k in ("id", "created", "model") if k in answer}
    head["object"] = "chat.completion.chunk"
    chunks: list[JSON] = []
    for choice in choices:
        if type(choice) is not dict:
            raise bad_response(target.endpoint, "a choice is not an object")
        at, message = choice.get("index", 0), choice.get("message")
        if message is not None and type(message) is not dict:
            raise bad_response(target.endpoint, "a choice's 'message' is not an object")
        delta = dict(message or {})
        calls = delta.get("tool_calls")
        if type(calls) is list:
            delta["tool_calls"] = [
                {**c, "index": i} for i, c in enumerate(calls) if type(c) is dict
            ]
        ended = {"index": at, "delta": {}, "finish_reason": choice.get("finish_reason")}
        chunks += [
            {**head, "choices": [{"index": at, "delta": delta}]},
            {**head, "choices": [ended]},
        ]
    if answer.get("usage") is not None:
        chunks.append({**head, "choices": [], "usage": answer["usage"]})
    return b"".join(b"data: " + _encode(chunk) + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"


_KEYS = (int, str, float, bool, type(None))  # an index of these types can key a dict


class CallNumbers:
    """Gives each streamed tool call an ``index`` of its own, as the OpenAI API does. Some
    servers send every call at index 0 (Ollama) or with none (Gemini's OpenAI endpoint), each
    new call with an id of its own: read as one call, their names, ids and arguments ran
    together, and a translated surface showed the first call with the others' arguments."""

    __slots__ = ("_by_id", "_latest", "_named", "_next")

    def __init__(self) -> None:
        self._by_id: dict[tuple[Any, str], int] = {}  # (choice, call id) -> index given
        self._latest: dict[tuple[Any, Any], int] = {}  # (choice, index sent) -> latest given
        self._next: dict[Any, int] = {}  # choice -> the next free index
        self._named: set[tuple[Any, int]] = set()  # (choice, index given) an id has claimed

    def number(self, chunk: JSON) -> None:
        """Set each tool call's ``index`` in ``chunk`` (in place) to the one it is given."""
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") if type(choice) is dict else None
            calls = delta.get("tool_calls") if type(delta) is dict else None
            if type(calls) is not list or type(at := choice.get("index", 0)) not in _KEYS:
                continue  # an index that is no key (a list) is left for the chunk's check
            for call in calls:
                if type(call) is dict and type(call.get("index")) in _KEYS:
                    call["index"] = self._index(at, call)

    def _index(self, at: Any, call: JSON) -> int:
        sent, call_id = call.get("index"), call.get("id")
        if type(call_id) is str and call_id:
            known = self._by_id.get((at, call_id))
            if known is None:
                begun = self._latest.get((at, sent))
                if begun is not None and (at, begun) not in self._named:
                    known = begun  # its id came after its first fragments
                else:
                    known = self._new(at)  # a new call
                self._by_id[(at, call_id)] = known
                self._named.add((at, known))
            self._latest[(at, sent)] = known
            return known
        latest = self._latest.get((at, sent))  # a fragment of the latest call sent so
        if latest is not None:
            return latest
        if type(sent) is int:  # a new call without an id
            latest = self._latest[(at, sent)] = self._new(at)
            return latest
        return max(self._next.get(at, 1) - 1, 0)

    def _new(self, at: Any) -> int:
        """The next index of choice ``at``: from 0 and without gaps, as OpenAI numbers calls
        (a server numbering them by content block sent 1 first; the SDKs' accumulators
        index a list by it)."""
        index = self._next.get(at, 0)
        self._next[at] = index + 1
        return index
