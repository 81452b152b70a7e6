"""Guard: the ingress never imports ``actors`` nor opens a database; only process wiring and
offline operator tools may.

A static scan of every module under ``gateway/`` (imports at any depth, ``importlib`` calls
with a literal name included). The runtime half is in
``tests/e2e/test_ingress_without_database_nats.py``: an ingress process under an audit hook that
refuses every SQLite connection.

The allow-list is by dotted module name. When a module moves (``gateway/`` is being laid out
in folders), update its name here: a listed module that no longer exists fails the test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GATEWAY = Path(__file__).resolve().parents[4] / "gateway"

WIRING = {
    "gateway.process.actor_host": "hosts the actor tree in a process of role all or actors",
    "gateway.cli.keys_offline": "llmgw keys with no gateway running (the first admin key)",
    "gateway.cli.logs_offline": "llmgw logs reading the file when no gateway serves it",
    "gateway.cli.replay": "llmgw replay validates the compared configs' routers (the strategies)",
    "gateway.replay.runner": "llmgw replay: the actor tree beside the ingress on a virtual clock",
}
"""Modules that may import ``actors`` (and, for the offline tools, open the database)."""

_DATABASE = ("sqlite3", "aiosqlite")
_INGRESS_ROOT = "gateway.ingress.app"  # the ASGI app: everything it imports serves HTTP


def _modules() -> dict[str, Path]:
    return {
        ".".join(("gateway", *p.relative_to(GATEWAY).with_suffix("").parts)).removesuffix(
            ".__init__"
        ): p
        for p in sorted(GATEWAY.rglob("*.py"))
    }


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, wherever the import statement sits."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    return found


def _top(name: str) -> str:
    return name.split(".", 1)[0]


MODULES = _modules()


def test_every_allow_listed_module_exists() -> None:
    assert sorted(set(WIRING) - set(MODULES)) == []


@pytest.mark.parametrize("name", sorted(set(MODULES) - set(WIRING)))
def test_gateway_module_imports_neither_actors_nor_a_database_driver(name: str) -> None:
    bad = sorted(i for i in _imports(MODULES[name]) if _top(i) in ("actors", *_DATABASE))
    assert bad == [], f"{name} imports {bad}: ask the owner actor over the bus instead"


def test_nothing_the_ingress_imports_is_process_wiring() -> None:
    """The transitive closure of ``gateway.ingress.app`` within ``gateway`` holds no allow-listed
    module, so the ingress cannot reach ``actors`` through one."""
    seen: set[str] = set()
    todo = [_INGRESS_ROOT]
    while todo:
        name = todo.pop()
        if name in seen or name not in MODULES:
            continue
        seen.add(name)
        todo.extend(i for i in _imports(MODULES[name]) if i in MODULES)
    assert len(seen) > 10  # the scan followed the app's imports
    assert sorted(seen & set(WIRING)) == []
