"""A reload keeps what is read at start only (``database``, ``bus``, ``cluster``,
``telemetry``, ``server`` but its body bounds) as the process started, and says what it did
not apply. A reload to another ``database.path`` rebuilt the store, the keys and the limits
from the new file: the API keys made in the one the process opened answered 401. On
``inproc://`` and NATS."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.e2e.conftest import CHAT, chat, config

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

ADMIN = "adm-at-start"
AUTH = {"authorization": f"Bearer {ADMIN}"}
_ECHO = {"id": "m", "route": [{"kind": "echo"}]}


async def test_a_reload_keeps_the_database_it_started_with_and_says_a_restart_is_needed(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    path = tmp_path / "gw.yaml"

    def declared(database: str, port: int | None = None, **extra: Any) -> dict[str, Any]:
        server = {"max_body_bytes": 1 << 20, **({"port": port} if port else {})}
        return config(
            _ECHO, admin_key=ADMIN, database={"path": str(tmp_path / database)}, server=server
        )

    gw = await gateway_factory(declared("first.sqlite3"), config_path=path)
    http = gw.http()
    made = await http.post(
        "/admin/keys", json={"org": "o", "user": "u", "role": "free"}, headers=AUTH
    )
    assert made.status_code == 201, made.text
    caller = {"authorization": f"Bearer {made.json()['key']}"}
    assert (await http.post(CHAT, json=chat("m"), headers=caller)).status_code == 200

    path.write_text(yaml.safe_dump(declared("second.sqlite3", port=1)))
    reloaded = await http.post("/admin/config/reload", json={}, headers=AUTH)
    served = await http.post(CHAT, json=chat("m"), headers=caller)
    again = await http.post("/admin/config/reload", json={}, headers=AUTH)

    assert reloaded.status_code == 200, reloaded.text
    assert served.status_code == 200, served.text  # the key is still in the store it opened
    assert not (tmp_path / "second.sqlite3").exists()
    assert reloaded.json()["restart_needed"] == ["database", "server.port"]
    assert again.json()["restart_needed"] == ["database", "server.port"]  # until a restart


@pytest.mark.parametrize("text", ["", "# being rewritten\n"])
async def test_a_reload_of_a_file_with_no_settings_is_refused_and_the_models_keep_serving(
    gateway_factory: GatewayFactory, tmp_path: Path, text: str
) -> None:
    # An editor's save or a deploy's copy caught half written: read as all defaults, the
    # reload removed every model and the admin key with them.
    path = tmp_path / "gw.yaml"
    gw = await gateway_factory(config(_ECHO, admin_key=ADMIN), config_path=path)
    http = gw.http()

    path.write_text(text)
    refused = await http.post("/admin/config/reload", json={}, headers=AUTH)
    served = await http.post(CHAT, json=chat("m"), headers=AUTH)

    assert refused.status_code == 400, refused.text
    assert "holds no settings" in refused.json()["error"]["message"]
    assert served.status_code == 200, served.text
