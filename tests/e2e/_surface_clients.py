"""One driver per client surface, so the surface matrix reads as one table.

Each driver speaks its surface through the official SDK (openai for chat and responses,
anthropic for messages) and reduces the answer to an :class:`Answer`, keeping each
dialect's own stop reason. Every request carries the same conversation: a system prompt, a
user turn, and (for tools) an earlier tool call ``call_prev`` with its result ``sunny``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anthropic
import openai

if TYPE_CHECKING:
    from tests.fixtures.gateway import RunningGateway

SYSTEM = "Be brief."
QUESTION = "What is the weather in Paris?"
PREV_CALL = "call_prev"
PREV_ARGS = {"city": "Oslo"}
PREV_RESULT = "sunny"
TOOL_NAME = "get_weather"
TOOL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
    "required": ["city"],
}
TEMPERATURE = 0.5
MAX_TOKENS = 64


@dataclass
class Answer:
    """What a client got, reduced to what the matrix compares."""

    text: str
    stop: str
    usage: tuple[int, int, int]  # (all input tokens incl. cached, output tokens, cached)
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, args JSON)
    deltas: list[str] = field(default_factory=list)  # streamed text or argument pieces
    routed_via: str = ""


class Routed:
    """An httpx event hook recording each answer's ``x-routed-via`` header."""

    def __init__(self) -> None:
        self.via: list[str] = []

    async def __call__(self, response: Any) -> None:
        self.via.append(response.headers.get("x-routed-via", ""))

    def client_kw(self, sdk: Any) -> dict[str, Any]:
        """``http_client=`` for an SDK client whose answers this hook records."""
        return {"http_client": sdk.DefaultAsyncHttpxClient(event_hooks={"response": [self]})}


class ChatDriver:
    """``POST /v1/chat/completions`` through ``openai.AsyncOpenAI``."""

    name = "chat"
    stops = ("stop", "tool_calls")
    bad_request = openai.BadRequestError

    def __init__(self, gw: RunningGateway) -> None:
        self.routed = Routed()
        self.client = gw.openai(**self.routed.client_kw(openai))

    def _args(self, tools: bool) -> dict[str, Any]:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": QUESTION},
        ]
        kw: dict[str, Any] = {"model": "m", "temperature": TEMPERATURE, "max_tokens": MAX_TOKENS}
        if tools:
            messages += [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": PREV_CALL,
                            "type": "function",
                            "function": {"name": TOOL_NAME, "arguments": _json(PREV_ARGS)},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": PREV_CALL, "content": PREV_RESULT},
            ]
            kw["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": TOOL_NAME,
                        "description": "Weather by city",
                        "parameters": TOOL_SCHEMA,
                    },
                }
            ]
        return {**kw, "messages": messages}

    async def plain(self, tools: bool = False) -> Answer:
        c = await self.client.chat.completions.create(**self._args(tools))
        return self._answer(c, [])

    async def stream(self, tools: bool = False) -> Answer:
        deltas: list[str] = []
        async with self.client.chat.completions.stream(
            **self._args(tools),
            stream_options={"include_usage": True},
        ) as s:
            async for event in s:
                if event.type == "content.delta" and event.delta:
                    deltas.append(event.delta)
                elif event.type == "tool_calls.function.arguments.delta":
                    deltas.append(event.arguments_delta)
            final = await s.get_final_completion()
        return self._answer(final, deltas)

    async def cut(self) -> tuple[str, str]:
        """Stream until the SDK reports the break: (text received before, error message)."""
        stream = await self.client.chat.completions.create(**self._args(False), stream=True)
        got: list[str] = []
        try:
            async for chunk in stream:
                for choice in chunk.choices:
                    assert choice.finish_reason is None, "a cut stream reported a finish"
                    got.append(choice.delta.content or "")
        except openai.APIError as exc:
            return "".join(got), exc.message
        raise AssertionError("the cut stream finished cleanly")

    def _answer(self, c: Any, deltas: list[str]) -> Answer:
        choice = c.choices[0]
        usage = c.usage
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        calls = [
            (t.id, t.function.name, t.function.arguments) for t in choice.message.tool_calls or ()
        ]
        return Answer(
            choice.message.content or "",
            choice.finish_reason,
            (usage.prompt_tokens, usage.completion_tokens, cached or 0),
            calls,
            deltas,
            self.routed.via[-1],
        )


class ResponsesDriver:
    """``POST /v1/responses`` through ``openai.AsyncOpenAI``."""

    name = "responses"
    stops = ("completed", "completed")
    bad_request = openai.BadRequestError

    def __init__(self, gw: RunningGateway) -> None:
        self.routed = Routed()
        self.client = gw.openai(**self.routed.client_kw(openai))

    def _args(self, tools: bool) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "model": "m",
            "instructions": SYSTEM,
            "temperature": TEMPERATURE,
            "max_output_tokens": MAX_TOKENS,
        }
        if not tools:
            return {**kw, "input": QUESTION}
        kw["input"] = [
            {"role": "user", "content": QUESTION},
            {
                "type": "function_call",
                "call_id": PREV_CALL,
                "name": TOOL_NAME,
                "arguments": _json(PREV_ARGS),
            },
            {"type": "function_call_output", "call_id": PREV_CALL, "output": PREV_RESULT},
        ]
        kw["tools"] = [
            {
                "type": "function",
                "name": TOOL_NAME,
                "description": "Weather by city",
                "parameters": TOOL_SCHEMA,
                "strict": False,
            }
        ]
        return kw

    async def plain(self, tools: bool = False) -> Answer:
        r = await self.client.responses.create(**self._args(tools))
        return self._answer(r, [])

    async def stream(self, tools: bool = False) -> Answer:
        deltas: list[str] = []
        async with self.client.responses.stream(**self._args(tools)) as s:
            async for event in s:
                if event.type in (
                    "response.output_text.delta",
                    "response.function_call_arguments.delta",
                ):
                    deltas.append(event.delta)
            final = await s.get_final_response()
        return self._answer(final, deltas)

    async def cut(self) -> tuple[str, str]:
        got: list[str] = []
        kinds: list[str] = []
        message = ""
        async with self.client.responses.stream(**self._args(False)) as s:
            async for event in s:
                kinds.append(event.type)
                if event.type == "response.output_text.delta":
                    got.append(event.delta)
                elif event.type == "error":
                    message = event.message
            assert "response.completed" not in kinds, kinds
            assert kinds[-2:] == ["error", "response.failed"], kinds
            try:
                await s.get_final_response()
            except RuntimeError:
                return "".join(got), message
        raise AssertionError("the cut stream finished cleanly")

    def _answer(self, r: Any, deltas: list[str]) -> Answer:
        usage = r.usage
        calls = [(o.call_id, o.name, o.arguments) for o in r.output if o.type == "function_call"]
        return Answer(
            r.output_text,
            r.status,
            (usage.input_tokens, usage.output_tokens, usage.input_tokens_details.cached_tokens),
            calls,
            deltas,
            self.routed.via[-1],
        )


class MessagesDriver:
    """``POST /v1/messages`` through ``anthropic.AsyncAnthropic``."""

    name = "messages"
    stops = ("end_turn", "tool_use")
    bad_request = anthropic.BadRequestError

    def __init__(self, gw: RunningGateway) -> None:
        self.routed = Routed()
        self.client = gw.anthropic(**self.routed.client_kw(anthropic))

    def _args(self, tools: bool) -> dict[str, Any]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
        # The anthropic 2.x SDK has no sampling arguments; the API still takes them.
        kw: dict[str, Any] = {
            "model": "m",
            "system": SYSTEM,
            "max_tokens": MAX_TOKENS,
            "extra_body": {"temperature": TEMPERATURE},
        }
        if tools:
            messages += [
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": PREV_CALL, "name": TOOL_NAME, "input": PREV_ARGS}
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": PREV_CALL, "content": PREV_RESULT}
                    ],
                },
            ]
            kw["tools"] = [
                {"name": TOOL_NAME, "description": "Weather by city", "input_schema": TOOL_SCHEMA}
            ]
        return {**kw, "messages": messages}

    async def plain(self, tools: bool = False) -> Answer:
        m = await self.client.messages.create(**self._args(tools))
        return self._answer(m, [])

    async def stream(self, tools: bool = False) -> Answer:
        deltas: list[str] = []
        async with self.client.messages.stream(**self._args(tools)) as s:
            async for event in s:
                if event.type == "text":
                    deltas.append(event.text)
                elif event.type == "input_json":
                    deltas.append(event.partial_json)
            final = await s.get_final_message()
        return self._answer(final, deltas)

    async def cut(self) -> tuple[str, str]:
        got: list[str] = []
        try:
            async with self.client.messages.stream(**self._args(False)) as s:
                async for event in s:
                    assert event.type != "message_stop", "a cut stream reported message_stop"
                    if event.type == "text":
                        got.append(event.text)
        except anthropic.APIStatusError as exc:
            return "".join(got), exc.message
        raise AssertionError("the cut stream finished cleanly")

    def _answer(self, m: Any, deltas: list[str]) -> Answer:
        u = m.usage
        cached = u.cache_read_input_tokens or 0
        text = "".join(b.text for b in m.content if b.type == "text")
        calls = [(b.id, b.name, _json(b.input)) for b in m.content if b.type == "tool_use"]
        prompt = u.input_tokens + cached + (u.cache_creation_input_tokens or 0)
        return Answer(
            text,
            m.stop_reason or "",
            (prompt, u.output_tokens, cached),
            calls,
            deltas,
            self.routed.via[-1],
        )


Driver = ChatDriver | ResponsesDriver | MessagesDriver
DRIVERS: dict[str, type[Driver]] = {
    "chat": ChatDriver,
    "responses": ResponsesDriver,
    "messages": MessagesDriver,
}


def error_body(exc: openai.APIStatusError | anthropic.APIStatusError) -> dict[str, Any]:
    """The decoded JSON body of an SDK's status error."""
    body = exc.body
    assert isinstance(body, dict), body
    return body


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


async def refused(gw: Any, surface: str, stream: bool) -> tuple[str, str]:
    """What the client saw of a refusal on ``surface`` (the question to model ``m``): its
    stop reason and the refusal's text (Responses: the incomplete reason)."""
    args = {"model": "m", "max_tokens": MAX_TOKENS}
    messages = [{"role": "user", "content": QUESTION}]
    if surface == "chat":
        client = gw.openai()
        if not stream:
            c = await client.chat.completions.create(messages=messages, **args)
            return c.choices[0].finish_reason, c.choices[0].message.refusal or ""
        text, finish = [], ""
        async for chunk in await client.chat.completions.create(
            messages=messages, stream=True, **args
        ):
            for choice in chunk.choices:
                text.append(choice.delta.content or choice.delta.refusal or "")
                finish = choice.finish_reason or finish
        return finish, "".join(text)
    if surface == "responses":
        client = gw.openai()
        kw = {"model": "m", "input": QUESTION, "max_output_tokens": MAX_TOKENS}
        if stream:
            async with client.responses.stream(**kw) as s:
                # A refused answer ends in response.incomplete, never response.completed.
                ends = [e.response async for e in s if e.type == "response.incomplete"]
            r = ends[-1]
        else:
            r = await client.responses.create(**kw)
        return r.status, r.incomplete_details.reason if r.incomplete_details else ""
    client = gw.anthropic()
    if stream:
        async with client.messages.stream(messages=messages, **args) as s:
            m = await s.get_final_message()
    else:
        m = await client.messages.create(messages=messages, **args)
    return m.stop_reason, "".join(b.text for b in m.content if b.type == "text")
