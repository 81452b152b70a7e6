"""The ``bedrock:`` settings of a route of kind ``bedrock`` (AWS Bedrock Converse)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BedrockSettings(BaseModel):
    """Where a ``bedrock`` route signs for and which credential chain it uses.

    ``region`` is the AWS region (SigV4's scope; the default endpoint is
    ``https://bedrock-runtime.{region}.amazonaws.com``, which the route's ``base_url``
    overrides, e.g. for a VPC endpoint). ``profile`` picks a profile of the shared AWS
    config for botocore's credential chain, used when the route has no ``api_key``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d+$")
    profile: str | None = Field(default=None, min_length=1)
