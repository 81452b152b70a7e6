"""``local_targets``: which routes the health-check loop polls."""

from __future__ import annotations

from gateway.process.healthcheck import local_targets
from schemas.config import GatewayConfig


def test_local_targets_leave_out_platform_routes_which_serve_no_health_path() -> None:
    cfg = GatewayConfig.model_validate(
        {
            "models": [
                {
                    "id": "m",
                    "route": [
                        {"kind": "openai_compat", "base_url": "http://127.0.0.1:8001/v1"},
                        {
                            "kind": "bedrock",
                            "base_url": "http://127.0.0.1:8002",
                            "bedrock": {"region": "us-east-1"},
                        },
                        {"kind": "azure_openai", "base_url": "http://127.0.0.1:8003"},
                        {"kind": "gemini", "base_url": "http://127.0.0.1:8004"},
                    ],
                }
            ]
        }
    )

    assert local_targets(cfg) == {"m:local-8001": "http://127.0.0.1:8001/health"}
