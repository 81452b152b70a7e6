"""A Messages client's ``document`` blocks (a base64 PDF, a text document) reach the route.

Claude Code sends a PDF its Read tool read as a ``document`` block with a base64 source, in
a user turn or inside a ``tool_result``; the Messages surface refused every such block
('document' blocks are not supported), though every translating adapter reads a chat
``file`` part. Now the block is that part: an ``anthropic`` route gets the ``document``
block back (title and cache mark kept), a ``gemini`` one ``inlineData``, a ``bedrock`` one a
Converse ``document``, and a source the gateway cannot carry (a URL, a file id) is a 400
naming it. Through the official ``anthropic`` SDK, against the scriptable fake upstreams
and the fake Bedrock, on the in-process bus.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import anthropic
import pytest

from tests.e2e.conftest import ONE_BUS, anthropic_route, config, model
from tests.e2e.test_bedrock_surfaces_sdk import bedrock_route
from tests.fixtures.upstream_bedrock import FakeBedrock

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

PDF = "JVBERi0xLjQKJcfsj6IK"
FILES: dict[str, Any] = {"input_modalities": ["text", "file"]}
DOCUMENT: dict[str, Any] = {
    "type": "document",
    "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
    "title": "report.pdf",
    "cache_control": {"type": "ephemeral"},
}


def _ask(*blocks: dict[str, Any]) -> Any:
    return [{"role": "user", "content": [*blocks, {"type": "text", "text": "Summarise."}]}]


async def test_pdf_document_reaches_claude_as_a_document_block(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    gw = await gateway_factory(config(model("m", anthropic_route(fake_upstream, **FILES))))

    answer = await gw.anthropic().messages.create(model="m", max_tokens=9, messages=_ask(DOCUMENT))

    assert answer.content[0].type == "text"
    assert fake_upstream.requests[-1].json["messages"][0]["content"] == [
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
            "title": "report.pdf",
            "cache_control": {"type": "ephemeral"},
        },
        {"type": "text", "text": "Summarise."},
    ]


async def test_pdf_in_a_tool_result_reaches_gemini_as_inline_data(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    gemini = {
        "kind": "gemini",
        "base_url": fake_upstream.gemini_base_url,
        "provider_model_id": "gemini-x",
        **FILES,
    }
    gw = await gateway_factory(config(model("m", gemini)))
    read = {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a.pdf"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [DOCUMENT]}
    conversation: Any = [
        {"role": "user", "content": "Read a.pdf"},
        {"role": "assistant", "content": [read]},
        {"role": "user", "content": [result]},
    ]

    answer = await gw.anthropic().messages.create(model="m", max_tokens=9, messages=conversation)

    assert answer.content[0].type == "text"
    parts = [p for c in fake_upstream.requests[-1].json["contents"] for p in c["parts"]]
    assert {"inlineData": {"mimeType": "application/pdf", "data": PDF}} in parts


async def test_pdf_and_text_documents_reach_bedrock_as_they_read_them(
    gateway_factory: GatewayFactory,
) -> None:
    bedrock = FakeBedrock("bedrock1")
    async with bedrock:
        gw = await gateway_factory(config(model("m", bedrock_route(bedrock, **FILES))))
        text = {"type": "text", "media_type": "text/plain", "data": "n"}
        notes = {"type": "document", "source": text}

        await gw.anthropic().messages.create(
            model="m", max_tokens=9, messages=_ask(DOCUMENT, notes)
        )

        content = bedrock.requests[-1].json["messages"][0]["content"]
    assert content[0] == {"document": {"format": "pdf", "name": "report", "source": {"bytes": PDF}}}
    assert content[-2:] == [{"text": "n"}, {"text": "Summarise."}]


@pytest.mark.parametrize(
    "source",
    [
        {"type": "url", "url": "https://example.com/a.pdf"},
        {"type": "file", "file_id": "file_1"},
    ],
)
async def test_document_source_the_gateway_cannot_carry_is_a_400_naming_it(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, source: dict[str, Any]
) -> None:
    gw = await gateway_factory(config(model("m", anthropic_route(fake_upstream, **FILES))))

    with pytest.raises(anthropic.BadRequestError) as refused:
        await gw.anthropic().messages.create(
            model="m", max_tokens=9, messages=_ask({"type": "document", "source": source})
        )

    assert "messages[0].content[0].source.type" in refused.value.message
    assert fake_upstream.requests == []


def _pdf(pages: int, padding: int) -> str:
    """A base64 PDF of ``pages`` page objects and ``padding`` bytes of image data."""
    kids = " ".join(f"{3 + i} 0 R" for i in range(pages))
    objects = [
        b"1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj",
        f"2 0 obj << /Type /Pages /Kids [{kids}] /Count {pages} >> endobj".encode(),
        *(f"{3 + i} 0 obj << /Type /Page /Parent 2 0 R >> endobj".encode() for i in range(pages)),
        b"9 0 obj << /Length %d >> stream\n" % padding + bytes(range(256)) * (padding // 256),
    ]
    return base64.b64encode(b"%PDF-1.4\n" + b"\n".join(objects)).decode()


async def test_a_large_pdf_is_counted_by_its_pages_not_its_bytes(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # Its base64 at 4 bytes a token said 333,000 tokens for this 3-page 1 MB PDF: the
    # context-window check refused it on a 200,000-token Claude route, and count_tokens
    # said as much; Claude bills 1,500 to 3,000 tokens a page.
    window = {**FILES, "context_window": 200_000}
    gw = await gateway_factory(config(model("m", anthropic_route(fake_upstream, **window))))
    document = {"type": "document", "source": {**DOCUMENT["source"], "data": _pdf(3, 1 << 20)}}
    client = gw.anthropic()

    counted = await client.messages.count_tokens(model="m", messages=_ask(document))
    answer = await client.messages.create(model="m", max_tokens=9, messages=_ask(document))

    assert 3 * 3_000 <= counted.input_tokens < 10_000
    assert answer.content[0].type == "text"
    assert len(fake_upstream.requests) == 1
