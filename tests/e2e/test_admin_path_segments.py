"""Admin paths through every HTTP engine: the raw path is split on ``/`` before each segment
is percent-decoded once, so an escaped slash (``%2F``) is part of a segment, never a
separator; a segment that is not UTF-8 or holds a NUL is a 400 in the admin error shape."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.e2e.conftest import assert_openai_error, config, model
from tests.fixtures.gateway import start_gateway

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.fixtures.gateway import RunningGateway

pytestmark = pytest.mark.e2e

ADMIN = "adm-path-key"
AUTH = {"authorization": f"Bearer {ADMIN}", "content-type": "application/json"}


@pytest.fixture
async def gw(tmp_path: Path, engine: str) -> AsyncIterator[RunningGateway]:
    """A gateway on ``engine`` with an echo model and an admin key."""
    running = await start_gateway(
        config(model("m", {"kind": "echo"}), admin_key=ADMIN, server={"engine": engine}),
        data_dir=tmp_path,
    )
    yield running
    await running.stop()


async def test_an_escaped_slash_in_an_admin_path_is_never_a_separator(
    gw: RunningGateway,
) -> None:
    # The server's decoded path was split: ``chains%2Flist`` ran ``chains/list``.
    client = gw.http()
    listed = await client.post("/admin/chains/list", headers=AUTH, json={})
    assert listed.status_code == 200, listed.text
    for path in ("/admin/chains%2Flist", "/admin%2Fchains/list", "/admin/chains%2flist"):
        err = assert_openai_error(await client.post(path, headers=AUTH, json={}), 404)
        assert "%2F" in err["message"], err
    limits = await client.get("/admin%2Flimits", headers=AUTH)
    assert_openai_error(limits, 404)


async def test_an_id_with_an_escaped_slash_reaches_its_handler_as_one_segment(
    gw: RunningGateway,
) -> None:
    client = gw.http()
    # A user's id is ``org/user``: sent as one escaped segment it is that user.
    resp = await client.put("/admin/limits/user/acme%2Fbob", headers=AUTH, json={"rpm": 5})
    assert resp.status_code == 200, resp.text
    assert resp.json()["subject"] == "user:acme/bob"
    got = await client.get("/admin/limits/user/acme/bob", headers=AUTH)
    assert got.status_code == 200 and got.json()["limit"]["rpm"] == 5, got.text
    # A key's id holds no ``/``: ``a%2Fb`` reaches the owner as the one id ``a/b`` (no such
    # key), where it was split into a path no route has.
    revoked = await client.delete("/admin/keys/a%2Fb", headers=AUTH)
    err = assert_openai_error(revoked, 404)
    assert "a/b" in err["message"] and "no such path" not in err["message"], err
    moved = await client.post(
        "/admin/provider-keys/a%2Fb/min-role", headers=AUTH, json={"min_role": "pro"}
    )
    err = assert_openai_error(moved, 404)
    assert "a/b" in err["message"] and "no such path" not in err["message"], err


@pytest.mark.parametrize(
    ("path", "says"),
    [("/admin/chains/li%FFst", "UTF-8"), ("/admin/limits/org/a%00b", "NUL")],
)
async def test_an_admin_path_that_does_not_decode_is_400(
    gw: RunningGateway, path: str, says: str
) -> None:
    resp = await gw.http().get(path, headers=AUTH)
    err = assert_openai_error(resp, 400)
    assert says in err["message"], err
