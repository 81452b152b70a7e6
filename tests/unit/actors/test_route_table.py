"""RouteTable: admin weight overrides and the local/remote split."""

from __future__ import annotations

import pytest

from actors.state.route_table import RouteTable
from gateway.process.config import parse_config
from schemas import InvalidRequestError, RouteNotFoundError

CONFIG = """
routing: {local_fraction: 0.8}
models:
  - id: m
    route:
      - {kind: openai_compat, base_url: "http://127.0.0.1:8000/v1", weight: 1}
      - {kind: openai_compat, base_url: "https://api.example.com/v1", weight: 1}
      - {kind: openai_compat, base_url: "https://api.other.com/v1", weight: 3}
"""


def _table(fixed: bool = True, text: str = CONFIG) -> RouteTable:
    cfg = parse_config(text)
    return RouteTable(cfg.models[0], cfg.routing, fixed=fixed)


def _weights(t: RouteTable) -> list[float]:
    return [round(r.weight, 6) for r in t.routes]


def test_local_fraction_gives_local_routes_that_share_of_the_total() -> None:
    assert _weights(_table()) == [4.0, 0.25, 0.75]


def test_local_fraction_is_ignored_for_routers_other_than_fixed() -> None:
    assert _weights(_table(fixed=False)) == [1.0, 1.0, 3.0]


def test_local_deployment_down_gives_all_weight_to_remote_routes() -> None:
    t = _table()
    t.set_local_health("m:local-8000", False)
    assert _weights(t) == [0.0, 1.25, 3.75]
    t.set_local_health("m:local-8000", True)
    assert _weights(t) == [4.0, 0.25, 0.75]


def test_set_weight_overrides_and_none_restores_configured() -> None:
    t = _table(text=CONFIG.replace("routing: {local_fraction: 0.8}", ""))
    t.set_weight("m:example-api", 7)
    assert _weights(t) == [1.0, 7.0, 3.0]
    assert t.overrides() == {"m:example-api": 7.0}
    t.set_weight("m:example-api", None)
    assert _weights(t) == [1.0, 1.0, 3.0]


def test_set_weight_negative_is_refused() -> None:
    with pytest.raises(InvalidRequestError):
        _table().set_weight("m:example-api", -1)


def test_set_weight_zeroing_the_last_nonzero_route_is_refused() -> None:
    t = _table()
    t.set_weight("m:local-8000", 0)
    t.set_weight("m:example-api", 0)
    with pytest.raises(InvalidRequestError, match="last route"):
        t.set_weight("m:other-api", 0)


def test_set_weight_unknown_endpoint_is_not_found() -> None:
    with pytest.raises(RouteNotFoundError):
        _table().set_weight("m:nope", 1)
