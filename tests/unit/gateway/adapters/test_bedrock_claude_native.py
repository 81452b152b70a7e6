"""A Messages client's ``is_error``, ``top_k`` and ``anthropic-beta`` flags reach Claude on
Bedrock as Converse says them.

``is_error`` is a ``toolResult``'s ``status: error`` (not the ``Error: `` prefix chat tool
messages carry), ``top_k`` goes in ``additionalModelRequestFields``; a model other than Claude
keeps the chat translation. Of the beta flags, only those Bedrock documents go on (it refuses
a request with one it does not know). Requests are checked against botocore's service model.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from botocore.loaders import Loader
from botocore.model import ServiceModel
from botocore.validate import ParamValidator

from gateway.adapters.bedrock import bedrock_betas
from gateway.adapters.bedrock_wire import to_converse_request
from gateway.formats import anthropic_messages

_SERVICE = ServiceModel(Loader().load_service_model("bedrock-runtime", "service-2"))
MESSAGES: Any = {
    "model": "m",
    "max_tokens": 10,
    "top_k": 5,
    "messages": [
        {"role": "user", "content": "run it"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "boom", "is_error": True}
            ],
        },
    ],
}


def _valid(req: dict[str, Any]) -> None:
    shape = _SERVICE.operation_model("Converse").input_shape
    report = ParamValidator().validate({"modelId": "x", **req}, shape)
    assert not report.has_errors(), report.generate_report()


def test_claude_on_bedrock_gets_is_error_as_status_and_top_k_as_a_model_field() -> None:
    req = to_converse_request(anthropic_messages.to_chat_request(MESSAGES), claude=True)

    _valid(req)
    assert req["messages"][-1]["content"] == [
        {"toolResult": {"toolUseId": "t1", "content": [{"text": "boom"}], "status": "error"}}
    ]
    assert req["additionalModelRequestFields"] == {"top_k": 5}


def test_other_bedrock_models_keep_the_chat_translation() -> None:
    req = to_converse_request(anthropic_messages.to_chat_request(MESSAGES), claude=False)

    _valid(req)
    [result] = req["messages"][-1]["content"]
    assert result["toolResult"]["content"] == [{"text": "Error: boom"}]
    assert result["toolResult"]["status"] == "success"
    assert "additionalModelRequestFields" not in req


@pytest.mark.parametrize(
    ("header", "sent", "dropped"),
    [
        ("context-1m-2025-08-07", ["context-1m-2025-08-07"], False),
        (
            "claude-code-20250219, interleaved-thinking-2025-05-14,context-1m-2025-08-07",
            ["interleaved-thinking-2025-05-14", "context-1m-2025-08-07"],
            True,
        ),
        ("effort-2025-11-24,effort-2025-11-24", ["effort-2025-11-24"], False),
        ("files-api-2025-04-14", [], True),
        (None, [], False),
    ],
    ids=["documented", "unknown among documented", "repeated", "only unknown", "none"],
)
def test_only_the_beta_flags_bedrock_documents_are_sent_the_rest_logged_at_debug(
    header: str | None, sent: list[str], dropped: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="gateway.adapters.bedrock"):
        assert bedrock_betas(header) == sent
    assert ("does not document" in caplog.text) is dropped
