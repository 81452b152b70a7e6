"""A PDF sent as a chat ``file`` part reaches a Gemini or Bedrock route as it reads one.

Gemini reads a document as ``inlineData`` (its MIME type and base64 data), as it reads an
image, and Bedrock's Converse as a ``document`` block (format, name, bytes); a chat client
sending a PDF (the openai SDK's ``file`` part with ``file_data``) to either, on a route
declared to take files, got a 400 ('part type file is not supported'). A file by id stays
the caller's 400 naming the field. Through the official openai SDK, against the scriptable
fake upstream and the fake Bedrock (which checks each body against botocore's service
model), on the in-process bus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai
import pytest

from tests.e2e.conftest import ONE_BUS, config, model
from tests.fixtures.upstream_bedrock import BEDROCK_KEY, BEDROCK_REGION, FakeBedrock

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

PDF = "JVBERi0xLjQKJcfsj6IK"


def _gemini(up: FakeUpstream) -> dict[str, Any]:
    return {
        "kind": "gemini",
        "base_url": up.gemini_base_url,
        "provider_model_id": "gemini-x",
        "input_modalities": ["text", "image", "file"],
    }


def _ask(file: dict[str, Any]) -> Any:
    return [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Summarise."}, {"type": "file", "file": file}],
        }
    ]


async def test_chat_pdf_file_part_reaches_gemini_as_inline_data(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    gw = await gateway_factory(config(model("m", _gemini(fake_upstream))))
    pdf = {"file_data": f"data:application/pdf;base64,{PDF}", "filename": "a.pdf"}

    answer = await gw.openai().chat.completions.create(model="m", messages=_ask(pdf))

    assert answer.choices[0].message.content
    parts = fake_upstream.requests[-1].json["contents"][0]["parts"]
    assert parts == [
        {"text": "Summarise."},
        {"inlineData": {"mimeType": "application/pdf", "data": PDF}},
    ]


async def test_chat_file_by_id_to_gemini_is_a_400_naming_the_field(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    gw = await gateway_factory(config(model("m", _gemini(fake_upstream))))

    with pytest.raises(openai.BadRequestError) as refused:
        await gw.openai().chat.completions.create(model="m", messages=_ask({"file_id": "f-1"}))

    assert refused.value.param == "messages[0].content[1].file.file_data"
    assert fake_upstream.requests == []


async def test_chat_pdf_file_part_reaches_bedrock_as_a_document_block(
    gateway_factory: GatewayFactory,
) -> None:
    async with FakeBedrock("bedrock1") as bedrock:
        route = {
            "kind": "bedrock",
            "base_url": bedrock.base_url,
            "bedrock": {"region": BEDROCK_REGION},
            "provider_model_id": "anthropic.claude-3-5-sonnet-20240620-v1:0",
            "api_key": BEDROCK_KEY,
            "input_modalities": ["text", "file"],
        }
        gw = await gateway_factory(config(model("m", route)))
        pdf = {"file_data": f"data:application/pdf;base64,{PDF}", "filename": "Q3 report.v2.pdf"}

        answer = await gw.openai().chat.completions.create(model="m", messages=_ask(pdf))

        assert answer.choices[0].message.content
        content = bedrock.requests[-1].json["messages"][0]["content"]
    assert content == [
        {"text": "Summarise."},
        {"document": {"format": "pdf", "name": "Q3 report v2", "source": {"bytes": PDF}}},
    ]
