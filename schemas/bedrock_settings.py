"""The ``bedrock:`` settings of a route of kind ``bedrock`` (AWS Bedrock Converse)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.process_config import Strict

# ARN resources whose id shows the model (``foundation-model/meta.llama3-...``, a system
# inference profile ``inference-profile/us.anthropic.claude-...``); the others (application
# inference profiles, provisioned and custom models, prompt routers) are opaque.
_NAMING_ARN_RESOURCES = ("foundation-model/", "inference-profile/")


class BedrockSettings(Strict):
    """Where a ``bedrock`` route signs for, which credential chain it uses, and what model
    family an opaque model id is.

    ``region`` is the AWS region (SigV4's scope; the default endpoint is
    ``https://bedrock-runtime.{region}.amazonaws.com``, which the route's ``base_url``
    overrides, e.g. for a VPC endpoint). ``profile`` picks a profile of the shared AWS
    config for botocore's credential chain, used when the route has no ``api_key``.
    ``model_family`` is the family of the model behind an application inference profile
    ARN, whose id does not show it; ``anthropic`` makes the route send Claude's thinking as
    for an ``anthropic.*`` id. Unset, the family is read from the model id.
    """

    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d+$")
    profile: str | None = Field(default=None, min_length=1)
    model_family: Literal["anthropic"] | None = None

    def contradiction(self, model_id: str) -> str | None:
        """Why ``model_family`` contradicts a model id that names another family, or None."""
        if self.model_family is None or not _names_its_family(model_id):
            return None
        if is_claude(model_id):
            return None
        return (
            f"bedrock.model_family: {self.model_family} contradicts provider_model_id "
            f"{model_id!r}, which names another family; model_family is for an opaque id "
            "such as an application inference profile ARN"
        )


def _names_its_family(model_id: str) -> bool:
    if model_id.startswith("arn:"):
        return model_id.split(":", 5)[-1].startswith(_NAMING_ARN_RESOURCES)
    return "." in model_id


def is_claude(model_id: str) -> bool:
    """Whether a Bedrock model id (or an ARN ending in one) names an Anthropic model."""
    return model_id.startswith("anthropic.") or ".anthropic." in model_id
