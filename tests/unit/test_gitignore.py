"""The repository ignores what a gateway run writes beside the code: the SQLite database and
its WAL and shared-memory files (which hold secrets until a checkpoint), and its socket."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "name", ["llmgw.sqlite3", "llmgw.sqlite3-wal", "llmgw.sqlite3-shm", "llmgw.sqlite3.sock"]
)
def test_files_a_gateway_writes_are_ignored(name: str) -> None:
    checked = subprocess.run(
        ["git", "check-ignore", "--no-index", "-q", name], cwd=REPO, check=False
    )
    assert checked.returncode == 0, f"{name} is not ignored"
