"""schemas.config: ``azure_openai`` and ``gemini`` routes and the ``azure:`` settings, as an
operator writes them in YAML."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from schemas.config import GatewayConfig

AZURE = """
models:
  - id: m
    route:
      - kind: azure_openai
        base_url: https://my-resource.openai.azure.com
        provider_model_id: gpt-4o
        api_key: k
        azure: {deployment: prod, api_version: 2024-10-21}
      - kind: gemini
        base_url: https://generativelanguage.googleapis.com
        provider_model_id: gemini-2.5-flash
        api_key: g
"""


def test_platform_routes_load_with_an_unquoted_api_version_date() -> None:
    config = GatewayConfig.model_validate(yaml.safe_load(AZURE))

    azure, gemini = config.models[0].route
    assert azure.azure is not None
    assert (azure.azure.deployment, azure.azure.api_version) == ("prod", "2024-10-21")
    assert (gemini.kind, gemini.azure) == ("gemini", None)
    assert [e.split(":")[1] for e in config.models[0].endpoint_ids()] == [
        "azure_openai-api",
        "gemini-api",
    ]


def test_azure_settings_on_another_kind_are_refused() -> None:
    doc = yaml.safe_load(AZURE)
    doc["models"][0]["route"][1]["azure"] = {"deployment": "x"}

    with pytest.raises(ValidationError, match="azure: belongs to a kind: azure_openai route"):
        GatewayConfig.model_validate(doc)
