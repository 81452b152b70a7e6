"""Gemini answers -> canonical chat: a ``GenerateContentResponse``, and the stream of them
``streamGenerateContent?alt=sse`` sends, as chunk dicts.

Public names are re-exported by ``gateway.adapters.gemini_wire``. What breaks the shapes of
google-genai's ``GenerateContentResponse`` among the fields read here (a string where the
candidates' list belongs, a text of 5, a function call's args as a list) is an
UpstreamBadResponseError, absent or null being as if empty; usage that is not sane is unknown.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.adapters.answer_fields import bad_answer, list_field, new_id, object_field, text_field
from gateway.adapters.provider_usage import provider_counts
from schemas.errors import UnusableAnswerError

if TYPE_CHECKING:
    from schemas import UpstreamBadResponseError

JSON = dict[str, Any]

_FILTERED = frozenset(
    {
        "SAFETY",
        "PROHIBITED_CONTENT",
        "BLOCKLIST",
        "SPII",
        "RECITATION",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
        "MODEL_ARMOR",
    }
)
_FAILED = frozenset(
    {
        "MALFORMED_FUNCTION_CALL",
        "UNEXPECTED_TOOL_CALL",
        "TOO_MANY_TOOL_CALLS",
        "MALFORMED_RESPONSE",
    }
)
"""Finish reasons saying the model's answer broke: no answer to hand on (as ``stop`` it was
an empty success), so the attempt fails and, with nothing sent yet, another route serves. The
request's tools and conversation make a model answer so, not a sick endpoint: never counted
against the route (:class:`UnusableAnswerError`)."""
_UNSIGNED = "MISSING_THOUGHT_SIGNATURE"
"""Gemini's "the request has at least one thought signature missing": no answer either, but
the request's doing (a tool call in its history that another provider made, or that lost its
signature), not the endpoint's: see :func:`_unsigned`."""
_encode = msgspec.json.Encoder().encode


def finish_reason(reason: Any, has_calls: bool) -> str:
    """The chat ``finish_reason`` for a Gemini ``finishReason``: ``MAX_TOKENS`` is
    ``length``, a safety, blocklist, PII or recitation stop is ``content_filter``, a stop
    with function calls is ``tool_calls``, anything else ``stop``. Raises
    UpstreamBadResponseError for a reason saying the answer broke (:data:`_FAILED`), or
    that the request lacked a thought signature (:data:`_UNSIGNED`, a 400)."""
    if reason in _FAILED:
        raise bad_answer(f"the model's answer ended with finishReason {reason}", unusable=True)
    if reason == _UNSIGNED:
        raise _unsigned()
    if reason == "MAX_TOKENS":
        return "length"
    if reason in _FILTERED:
        return "content_filter"
    return "tool_calls" if has_calls else "stop"


def _unsigned() -> UpstreamBadResponseError:
    """The error of an answer ended by :data:`_UNSIGNED`: status 400, the request's, as if
    Gemini had refused it so (it does, for the current turn): it never counts against the
    endpoint (one client's history must not open the route's circuit for every caller), the
    next route may still serve, and with none the client gets the 400."""
    err = bad_answer(
        f"the model's answer ended with finishReason {_UNSIGNED}: a tool call in the "
        "request's history lacks the thought signature Gemini gave it (one made by another "
        "provider, or whose id lost it)"
    )
    err.status = 400
    return err


def _empty(thoughts: bool) -> UpstreamBadResponseError:
    """The error of a candidate whose finish is a plain ``stop`` (``STOP``, none, ``OTHER``,
    ``LANGUAGE``...) with no text and no function call (thinking models do, now and then,
    and some conversation shapes every time): no answer to hand on,
    so the attempt fails and, with nothing sent yet, another route serves; never the
    endpoint's failure (:class:`UnusableAnswerError`). ``thoughts``: it thought, and said
    nothing. (A ``MAX_TOKENS`` or filtered finish with no text is an answer: ``length``,
    ``content_filter``.)"""
    said = "only thoughts, no text or function call" if thoughts else "no text or function call"
    return bad_answer(f"the model returned an empty answer ({said})", unusable=True)


def chat_usage(meta: Any) -> JSON | None:
    """Chat usage from ``usageMetadata``: the prompt count includes the cached tokens, and the
    completion counts the thinking tokens Gemini bills as output. None when a count is not
    a number (:func:`provider_counts`)."""
    counts = provider_counts(
        meta,
        "promptTokenCount",
        "thoughtsTokenCount",
        "candidatesTokenCount",
        "cachedContentTokenCount",
    )
    if counts is None:
        return None
    prompt, thoughts, candidates, cached = counts
    completion = candidates + thoughts
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": thoughts},
    }


SIGNATURE_MARK = "__sig_"
"""Joins a tool call's id and the ``thoughtSignature`` Gemini gave its ``functionCall``
(URL-safe base64): the client echoes the id in the next turn's history, where Gemini's
thinking models need the signature back on that call (``gemini_wire`` splits it off)."""


def call_id(base: str, signature: Any) -> str:
    """The canonical tool call id for a ``functionCall`` (its signature folded in)."""
    if not isinstance(signature, str) or not signature:
        return base
    return base + SIGNATURE_MARK + signature.replace("+", "-").replace("/", "_").rstrip("=")


def split_call_id(value: str) -> tuple[str, str | None]:
    """``(id, thoughtSignature or None)`` from an id :func:`call_id` made."""
    base, mark, folded = value.partition(SIGNATURE_MARK)
    if not mark or not folded:
        return value, None
    padded = folded.replace("-", "+").replace("_", "/") + "=" * (-len(folded) % 4)
    return base, padded


def block_reason(data: JSON) -> str | None:
    """Why Gemini refused the prompt itself (``promptFeedback.blockReason``), if it did.
    Raises UpstreamBadResponseError when the feedback is not an object or the reason not a
    string."""
    feedback = data.get("promptFeedback")
    if feedback is None:
        return None
    if type(feedback) is not dict:
        raise bad_answer("the answer's 'promptFeedback' is not an object")
    return text_field(feedback, "blockReason", "the promptFeedback") or None


def _refusal(reason: str) -> str:
    return f"the upstream's safety filter blocked the prompt ({reason})"


def _candidate(cand: Any, position: int) -> tuple[int, JSON | None, str | None]:
    """A candidate's index (absent, as Gemini leaves a 0 out: its position), ``content``
    and ``finishReason``. Raises UpstreamBadResponseError when the candidate is not an object,
    its index not an integer, its content not an object or its finish reason not a string."""
    if type(cand) is not dict:
        raise bad_answer("a candidate is not an object")
    index = cand.get("index")
    if index is None:
        index = position
    elif type(index) is not int:
        raise bad_answer("a candidate's 'index' is not an integer")
    content = cand.get("content")
    if content is not None and type(content) is not dict:
        raise bad_answer("a candidate's 'content' is not an object")
    return index, content, text_field(cand, "finishReason", "a candidate")


def _split(content: JSON | None, first_call: int) -> tuple[str, str, list[JSON]]:
    """(answer text, thought text, tool calls numbered from ``first_call``) of a candidate's
    ``content``. Raises UpstreamBadResponseError for ``parts`` that break the API's shapes:
    not a list, a part not an object, a text not a string, a thought not a boolean, a
    function call as :func:`_function_call` says."""
    # The hot path (one chunk per few tokens): exact type tests, only the keys it reads.
    text: list[str] = []
    thoughts: list[str] = []
    calls: list[JSON] = []
    parts = content.get("parts") if content is not None else None
    if parts is None:
        return "", "", calls
    if type(parts) is not list:
        raise bad_answer("a content's 'parts' is not a list")
    for part in parts:
        if type(part) is not dict:
            raise bad_answer("a part is not an object")
        call = part.get("functionCall")
        if call is not None:
            calls.append(
                _function_call(call, part.get("thoughtSignature"), first_call + len(calls))
            )
            continue
        value = part.get("text")
        if value is None:
            continue  # inline data, executable code...: no chat form
        if type(value) is not str:
            raise bad_answer("a part's 'text' is not a string")
        thought = part.get("thought")
        if thought is None or thought is False:
            text.append(value)
        elif thought is True:
            thoughts.append(value)
        else:
            raise bad_answer("a part's 'thought' is not a boolean")
    return "".join(text), "".join(thoughts), calls


def _function_call(call: Any, signature: Any, n: int) -> JSON:
    """The chat tool call for a part's ``functionCall`` (the ``n``th of its candidate).
    Raises UpstreamBadResponseError when it is not an object, its ``name`` or ``id`` not a
    string, its ``args`` not an object, or the part's ``thoughtSignature`` not a string.
    (A name may be absent in the types: it is then empty.)"""
    if type(call) is not dict:
        raise bad_answer("a part's 'functionCall' is not an object")
    name = text_field(call, "name", "a functionCall") or ""
    base = text_field(call, "id", "a functionCall") or f"call_{n}"
    args = object_field(call, "args", "a functionCall")
    if signature is not None and type(signature) is not str:
        raise bad_answer("a part's 'thoughtSignature' is not a string")
    return {
        "id": call_id(base, signature),
        "type": "function",
        "function": {"name": name, "arguments": _encode(args).decode()},
    }


def from_gemini_response(data: JSON, *, model: str) -> JSON:
    """A canonical chat completion from a ``GenerateContentResponse``. A blocked prompt is an
    answer with a ``refusal`` and ``finish_reason: content_filter``.

    Raises UpstreamBadResponseError when ``data`` breaks the API's shapes: ``candidates`` not
    a list, a candidate, its ``content`` or a part not an object, a text, finish reason,
    block reason or function call id or name not a string, function call ``args`` not an
    object. A ``usageMetadata`` that is not an object, or a count in it that is not a whole
    number, leaves the usage unknown (None)."""
    choices: list[JSON] = []
    blocked = block_reason(data)
    try:
        for i, cand in enumerate(list_field(data, "candidates", "the answer")):
            index, content, reason = _candidate(cand, i)
            text, thoughts, calls = _split(content, 0)
            message: JSON = {"role": "assistant", "content": text if text or not calls else None}
            if thoughts:
                message["reasoning_content"] = thoughts
            if calls:
                message["tool_calls"] = calls
            # A blocked prompt ends a candidate that gave no reason of its own: filtered.
            finish = (
                "content_filter" if blocked and not reason else finish_reason(reason, bool(calls))
            )
            # Every finish that is a plain stop (STOP, none, OTHER, LANGUAGE, one Gemini adds):
            # with no text and no call it handed nothing on.
            if finish == "stop" and not text:
                raise _empty(bool(thoughts))
            choices.append({"index": index, "message": message, "finish_reason": finish})
    except UnusableAnswerError as exc:
        exc.usage = chat_usage(data.get("usageMetadata"))  # Gemini billed what it generated
        raise
    if not choices and blocked:
        message = {"role": "assistant", "content": None, "refusal": _refusal(blocked)}
        choices.append({"index": 0, "message": message, "finish_reason": "content_filter"})
    answer_id, version = data.get("responseId"), data.get("modelVersion")
    return {
        "id": "chatcmpl-" + (answer_id if type(answer_id) is str and answer_id else new_id("")),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": version if type(version) is str and version else model,
        "choices": choices,
        "usage": chat_usage(data.get("usageMetadata")),
    }


class GeminiToChatStream:
    """Turns the stream's ``GenerateContentResponse`` chunks into canonical chat chunks.

    Gemini's stream has no terminator event: it is complete once every candidate it named
    gave a ``finishReason`` (or the prompt was blocked). Only then come the finish chunk and,
    when asked, the usage chunk (the last ``usageMetadata`` any event carried: Gemini sends
    running totals, not always with the finishing event), so a stream cut before never looks
    done. A candidate that
    stops having carried no text and no function call is an empty answer (:func:`_empty`)."""

    __slots__ = (
        "_calls",
        "_complete",
        "_created",
        "_id",
        "_include_usage",
        "_model",
        "_open",
        "_shown",
        "_usage",
    )

    def __init__(self, model: str, *, include_usage: bool = True) -> None:
        self._model = model
        self._include_usage = include_usage
        self._id = new_id("chatcmpl-")
        self._created = int(time.time())
        self._complete = False
        self._calls: dict[int, int] = {}  # candidate index -> tool calls sent
        self._open: dict[int, str | None] = {}  # candidate index -> its finish, once given
        self._shown: dict[int, bool] = {}  # candidate index -> carried text (else thoughts)
        self._usage: Any = None  # the last usageMetadata an event carried

    @property
    def is_complete(self) -> bool:
        """True once every candidate finished, or the prompt was blocked."""
        return self._complete

    def _chunk(self, choices: list[JSON], usage: JSON | None = None) -> JSON:
        out: JSON = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": choices,
        }
        if usage is not None:
            out["usage"] = usage
        return out

    def feed(self, data: JSON) -> list[JSON]:
        """The chunks one streamed ``GenerateContentResponse`` says. Raises
        UpstreamBadResponseError when it breaks the API's shapes (as for
        :func:`from_gemini_response`)."""
        out: list[JSON] = []
        if (meta := data.get("usageMetadata")) is not None:
            self._usage = meta  # running totals: a later event without any keeps them
        for i, cand in enumerate(list_field(data, "candidates", "a chunk")):
            index, content, reason = _candidate(cand, i)
            sent = self._calls.get(index, 0)
            text, thoughts, calls = _split(content, sent)
            delta: JSON = {}
            if index not in self._open:
                self._open[index] = None
                delta["role"] = "assistant"
            if text:
                delta["content"] = text
                self._shown[index] = True
            if thoughts:
                delta["reasoning_content"] = thoughts
                self._shown.setdefault(index, False)
            if calls:
                delta["tool_calls"] = [{"index": sent + k, **c} for k, c in enumerate(calls)]
                self._calls[index] = sent + len(calls)
            if delta:
                out.append(self._chunk([{"index": index, "delta": delta, "finish_reason": None}]))
            if reason:
                ended = finish_reason(reason, bool(self._calls.get(index)))
                if ended == "stop" and not self._shown.get(index):
                    empty = _empty(index in self._shown)
                    empty.usage = chat_usage(self._usage)  # billed all the same
                    raise empty
                self._open[index] = ended
        blocked = block_reason(data)
        if blocked:
            # The prompt was refused: nothing more comes, whatever candidate began (waiting
            # for its finish turned the refusal into a stream ending without one).
            if not self._open:
                delta = {"role": "assistant", "refusal": _refusal(blocked)}
                out.append(self._chunk([{"index": 0, "delta": delta, "finish_reason": None}]))
                self._open[0] = None
            for index, finish in self._open.items():
                self._open[index] = finish or "content_filter"
        if self._open and all(self._open.values()):
            self._complete = True
            for index, finish in self._open.items():
                out.append(self._chunk([{"index": index, "delta": {}, "finish_reason": finish}]))
            if self._include_usage:
                out.append(self._chunk([], chat_usage(self._usage)))
        return out
