"""The quick start's ``echo`` upstream answers what the SDK helpers ask of a model.

``llmgw serve`` with the bundled demo config, as a real process, through the official SDKs:
``chat.completions.parse`` with a pydantic model (plain and streamed), a forced tool whose
arguments the SDK parses into the model, ``n`` choices, and the same through the Responses
(``responses.parse``) and Messages (a forced ``tool_use``) surfaces.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

import anthropic
import openai
import pytest
from pydantic import BaseModel, Field

from tests.fixtures.gateway import GatewayProcess

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

pytestmark = pytest.mark.e2e

ASK: list[Any] = [{"role": "user", "content": "weather in Paris?"}]


class Unit(StrEnum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Place(BaseModel):
    city: str
    country_code: str = Field(min_length=2, max_length=2)


class Forecast(BaseModel):
    """What the SDK turns into a strict json_schema with $defs, enums and bounds."""

    place: Place
    unit: Unit
    kind: Literal["sunny", "rain"]
    days: int = Field(ge=1, le=7)
    chance: float = Field(gt=0, lt=1)
    alerts: list[str]
    windy: bool
    note: str | None


LOCATE: Any = Place.model_json_schema()


@pytest.fixture(scope="module")
def demo() -> Iterator[str]:
    """The URL of ``llmgw serve`` run with no config (the bundled demo), for this module."""
    proc = GatewayProcess(["serve", "--port", "0"]).start()
    try:
        yield proc.url
    finally:
        assert "Traceback" not in proc.stop()


@pytest.fixture
async def client(demo: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{demo}/v1", api_key="sk-x", max_retries=0) as c:
        yield c


async def test_chat_parse_with_a_pydantic_model_gets_a_valid_instance_plain_and_streamed(
    client: openai.AsyncOpenAI,
) -> None:
    plain = await client.chat.completions.parse(
        model="demo", messages=ASK, response_format=Forecast
    )
    async with client.chat.completions.stream(
        model="demo", messages=ASK, response_format=Forecast
    ) as stream:
        streamed = await stream.get_final_completion()

    for answer in (plain, streamed):
        parsed = answer.choices[0].message.parsed
        assert isinstance(parsed, Forecast), answer
        assert 1 <= parsed.days <= 7 and 0 < parsed.chance < 1
        assert answer.choices[0].finish_reason == "stop"


async def test_chat_forced_tool_gets_a_call_whose_arguments_parse_into_the_model(
    client: openai.AsyncOpenAI,
) -> None:
    tools = [
        openai.pydantic_function_tool(Forecast, name="forecast"),
        openai.pydantic_function_tool(Place, name="locate"),
    ]
    forced: Any = {"type": "function", "function": {"name": "locate"}}

    plain = await client.chat.completions.parse(
        model="demo", messages=ASK, tools=tools, tool_choice=forced
    )
    async with client.chat.completions.stream(
        model="demo",
        messages=ASK,
        tools=tools,
        tool_choice=forced,
    ) as stream:
        streamed = await stream.get_final_completion()
    offered = await client.chat.completions.parse(model="demo", messages=ASK, tools=tools)
    declined = await client.chat.completions.create(
        model="demo", messages=ASK, tools=tools, tool_choice="none"
    )

    for answer in (plain, streamed):
        (call,) = answer.choices[0].message.tool_calls or []
        assert call.function.name == "locate"
        assert isinstance(call.function.parsed_arguments, Place)
        assert answer.choices[0].finish_reason == "tool_calls"
    (call,) = offered.choices[0].message.tool_calls or []
    assert isinstance(call.function.parsed_arguments, Forecast)
    assert declined.choices[0].message.content == "echo: weather in Paris?"


async def test_chat_n_gets_that_many_choices_plain_and_streamed(
    client: openai.AsyncOpenAI,
) -> None:
    plain = await client.chat.completions.create(model="demo", messages=ASK, n=3)
    stream = await client.chat.completions.create(model="demo", messages=ASK, n=2, stream=True)
    texts: dict[int, str] = {}
    async for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")

    assert [c.index for c in plain.choices] == [0, 1, 2]
    assert {c.message.content for c in plain.choices} == {"echo: weather in Paris?"}
    assert texts == {0: "echo: weather in Paris?", 1: "echo: weather in Paris?"}


async def test_json_object_format_gets_a_json_object(client: openai.AsyncOpenAI) -> None:
    answer = await client.chat.completions.create(
        model="demo", messages=ASK, response_format={"type": "json_object"}
    )

    assert answer.choices[0].message.content == '{"echo":"echo: weather in Paris?"}'


async def test_responses_parse_and_messages_forced_tool_translate_to_the_echo(
    client: openai.AsyncOpenAI,
    demo: str,
) -> None:
    response = await client.responses.parse(model="demo", input="weather?", text_format=Forecast)
    async with anthropic.AsyncAnthropic(base_url=demo, api_key="sk-x", max_retries=0) as claude:
        message = await claude.messages.create(
            model="demo",
            max_tokens=64,
            messages=ASK,
            tools=[{"name": "locate", "input_schema": LOCATE}],
            tool_choice={"type": "tool", "name": "locate"},
        )

    assert isinstance(response.output_parsed, Forecast)
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "locate"
    Place.model_validate(block.input)
    assert message.stop_reason == "tool_use"
