"""A Messages client's ``is_error`` and ``top_k`` reach Claude on Bedrock as Converse says them.

``is_error`` is a ``toolResult``'s ``status: error`` (not the ``Error: `` prefix chat tool
messages carry), ``top_k`` goes in ``additionalModelRequestFields``; a model other than Claude
keeps the chat translation. Requests are checked against botocore's service model.
"""

from __future__ import annotations

from typing import Any

from botocore.loaders import Loader
from botocore.model import ServiceModel
from botocore.validate import ParamValidator

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
