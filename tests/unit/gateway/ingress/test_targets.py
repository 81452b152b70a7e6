"""Credential resolution: a plan's candidate becomes the same immutable target while its
route and secret stay, and a new one when the secret changes."""

from __future__ import annotations

from gateway.ingress.plan_walk import Targets
from schemas import RouteCandidate
from schemas.config import GatewayConfig


class _Rotating:
    """Runtime secrets an operator may replace."""

    def __init__(self) -> None:
        self.secrets = {"k1": "sk-first"}

    def get(self, cid: str) -> str | None:
        return self.secrets.get(cid)


def test_a_candidate_resolves_to_one_target_until_its_secret_changes() -> None:
    runtime = _Rotating()
    targets = Targets(GatewayConfig.model_validate({}), runtime)
    c = RouteCandidate(
        endpoint="m#0", kind="openai_compat", base_url="http://u/v1", credential_id="k1"
    )
    first = targets.resolve(c)
    assert first.api_key == "sk-first" and first.endpoint == "m#0"
    assert targets.resolve(c) is first
    runtime.secrets["k1"] = "sk-second"
    assert targets.resolve(c).api_key == "sk-second"
    del runtime.secrets["k1"]
    assert targets.resolve(c).api_key is None
    other = RouteCandidate(endpoint="m#0", kind="openai_compat", base_url="http://v/v1")
    assert targets.resolve(other).base_url == "http://v/v1"
