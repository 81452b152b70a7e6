"""Tests of ``llmgw replay``: shared configs and providers files for them."""

from __future__ import annotations

from gateway.replay.providers import ProvidersFile
from schemas.config import GatewayConfig


def two_routes(**routing: object) -> GatewayConfig:
    """Model ``m`` on routes ``m:cheap`` (slow) and ``m:fast`` (dear), fixed equal weights."""
    return GatewayConfig.model_validate(
        {
            "routing": {"affinity": {"enabled": False}, **routing},
            "models": [
                {
                    "id": "m",
                    "route": [
                        {
                            "kind": "openai_compat",
                            "base_url": "http://cheap/v1",
                            "pricing": {"prompt": 1.0, "completion": 2.0},
                        },
                        {
                            "kind": "openai_compat",
                            "base_url": "http://fast/v1",
                            "pricing": {"prompt": 4.0, "completion": 8.0},
                        },
                    ],
                }
            ],
        }
    )


def providers(**cheap: object) -> ProvidersFile:
    """Both routes healthy and roomy; ``cheap`` overrides the cheap route's behaviour."""
    return ProvidersFile.model_validate(
        {
            "providers": [
                {"endpoint": "m:cheap", "ttft": {"median": 0.4, "p90": 0.8}, **cheap},
                {"endpoint": "m:fast", "ttft": {"median": 0.1, "p90": 0.2}, "output_tps": 100},
            ]
        }
    )
