"""RouteTable: exact routes first, then the longest matching prefix, whatever order the
routes are listed in."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from gateway.ingress.app import Route, RouteTable

if TYPE_CHECKING:
    from gateway.http.request import HttpRequest


async def catch_all(req: HttpRequest) -> None: ...
async def keys(req: HttpRequest) -> None: ...
async def create_key(req: HttpRequest) -> None: ...
async def models(req: HttpRequest) -> None: ...


ROUTES = (
    Route("POST", "/admin/", catch_all, prefix=True),
    Route("POST", "/admin/keys/", keys, prefix=True),
    Route("POST", "/admin/keys", create_key),
    Route("GET", "/v1/models/", models, prefix=True),
)


def test_every_listing_order_finds_the_same_handlers() -> None:
    for order in itertools.permutations(ROUTES):
        table = RouteTable(order)
        assert table.find("POST", "/admin/keys/k1/revoke") is keys  # longer than /admin/
        assert table.find("POST", "/admin/keys") is create_key  # exact before any prefix
        assert table.find("POST", "/admin/config/reload") is catch_all
        assert table.find("GET", "/v1/models/m") is models


def test_a_known_path_without_the_method_is_told_apart_from_an_unknown_one() -> None:
    table = RouteTable((*ROUTES, Route("GET", "/admin/keys", keys)))
    assert table.find("PUT", "/admin/keys") is None
    assert table.allowed("/admin/keys") == ["GET", "POST"]  # 405, its Allow
    assert table.allowed("/v1/models/m") == ["GET"]
    assert table.find("GET", "/nowhere") is None
    assert table.allowed("/nowhere") == []  # 404
