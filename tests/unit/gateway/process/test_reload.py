"""Config reload at the ingress: targets of removed routes, and the follower's swaps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.ingress.plan_walk import FallbackTargets, Targets
from gateway.process.reload import ConfigFollower
from schemas import InvalidRequestError, RouteCandidate
from schemas.config import GatewayConfig, credential_id

if TYPE_CHECKING:
    import pytest


def cfg(*models: tuple[str, str]) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "models": [
                {
                    "id": m,
                    "route": [
                        {
                            "kind": "openai_compat",
                            "base_url": "https://api.example.com/v1",
                            "api_key": key,
                        }
                    ],
                }
                for m, key in models
            ]
        }
    )


def candidate(config: GatewayConfig, model: str, key: str) -> RouteCandidate:
    [m] = [m for m in config.models if m.id == model]
    return RouteCandidate(
        endpoint=m.endpoint_ids()[0], kind="openai_compat", credential_id=credential_id(key)
    )


def test_fallback_targets_resolve_a_removed_endpoint_from_the_previous_config() -> None:
    old, new = cfg(("x", "sk-x"), ("y", "sk-y")), cfg(("y", "sk-y2"))
    targets = FallbackTargets(new, Targets(old))

    assert targets.resolve(candidate(old, "x", "sk-x")).api_key == "sk-x"
    assert targets.resolve(candidate(old, "y", "sk-y")).api_key == "sk-y"  # planned before
    assert targets.resolve(candidate(new, "y", "sk-y2")).api_key == "sk-y2"


class App:
    def __init__(self) -> None:
        self.configs: list[GatewayConfig] = []

    def reconfigure(self, config: GatewayConfig) -> None:
        self.configs.append(config)


def test_follower_swaps_once_per_new_version_and_keeps_the_config_on_a_refusal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = App()
    loaded: list[Any] = [
        (cfg(("x", "k")), "v2"),
        (cfg(("x", "k")), "v2"),
        InvalidRequestError("gw.yaml: models[0].id: Field required"),
    ]

    def load() -> tuple[GatewayConfig, str]:
        item = loaded.pop(0)
        if isinstance(item, Exception):
            raise item
        return item  # type: ignore[no-any-return]

    follower = ConfigFollower(app, load, "v1")
    swapped = [follower.sync("v2"), follower.sync("v2"), follower.sync("v3")]

    assert swapped == [True, False, False]
    assert len(app.configs) == 1 and follower.version == "v2"
    assert "models[0].id: Field required" in caplog.text


def test_each_follower_names_itself_in_what_it_logs(caplog: pytest.LogCaptureFixture) -> None:
    """A process running the ingress and the sidecars follows each reload twice: their lines
    said "ingress" both, as if the ingress had swapped (or refused) twice."""
    caplog.set_level("INFO", logger="gateway.process.reload")
    loaded: list[Any] = [(cfg(("x", "k")), "v2"), InvalidRequestError("gw.yaml: bad")]

    def load() -> tuple[GatewayConfig, str]:
        item = loaded.pop(0)
        if isinstance(item, Exception):
            raise item
        return item  # type: ignore[no-any-return]

    follower = ConfigFollower(App(), load, "v1", who="sidecars")
    follower.sync("v2")
    follower.sync("v3")

    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "sidecars: now serving config version v2 (1 models)"
    assert "(sidecars): gw.yaml: bad" in lines[1]
    assert not any("ingress" in line for line in lines)
