"""Guard: a CLI command loads only what it uses. ``llmgw keys create`` on a database file, run
in a fresh interpreter, must not import the NATS client (with aiohttp), Hypercorn or the actor
tree: each costs every command (and every test that runs one) a share of a second of start-up.
The lazily imported names still resolve when asked for."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
HEAVY = ("nats", "aiohttp", "hypercorn", "actors.tree", "actors.model")

_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from gateway.cli.main import main

    argv = ["keys", "create", "--org", "a", "--user", "u", "--role", "free", "--db", %r]
    code = main([*argv, "--json"])
    loaded = [m for m in %r if m in sys.modules]
    from actors import build_tree
    from bus import NatsBus
    print(json.dumps({"code": code, "loaded": loaded,
                      "lazy": [build_tree.__module__, NatsBus.__module__]}))
    """
)


def test_keys_create_on_a_file_imports_no_nats_hypercorn_or_actor_tree(tmp_path: Path) -> None:
    script = _SCRIPT % (str(tmp_path / "llmgw.sqlite3"), HEAVY)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 0
    assert report["loaded"] == []
    assert report["lazy"] == ["actors.tree", "bus.nats_bus"]
