"""The dashboard's replay reports folder: the report folders it lists (newest first, only
those with a report.json) and the files it reads (only a report's, never a path)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from gateway.dashboard.reports import ReportsFolder
from schemas import RouteNotFoundError

if TYPE_CHECKING:
    from pathlib import Path


async def test_lists_report_folders_newest_first_with_their_report_files(tmp_path: Path) -> None:
    for name, mtime in (("old", 1_000.0), ("new", 2_000.0)):
        (tmp_path / name).mkdir()
        report = tmp_path / name / "report.json"
        report.write_text("{}")
        os.utime(report, (mtime, mtime))
    (tmp_path / "new" / "frontier.png").write_bytes(b"png")
    (tmp_path / "new" / "notes.txt").write_text("not a report file")
    (tmp_path / "empty").mkdir()  # no report.json: not a report

    listing = await ReportsFolder(str(tmp_path)).listing()

    assert listing["configured"] is True
    assert [(r["name"], r["files"]) for r in listing["reports"]] == [
        ("new", ["frontier.png", "report.json"]),
        ("old", ["report.json"]),
    ]
    assert await ReportsFolder(None).listing() == {"configured": False, "reports": []}


@pytest.mark.parametrize(
    ("report", "name"),
    [("..", "secret.json"), ("r", "../secret.json"), ("r", "notes.txt"), ("r", "gone.png")],
)
async def test_reads_only_a_reports_own_files(tmp_path: Path, report: str, name: str) -> None:
    (tmp_path / "reports" / "r").mkdir(parents=True)
    (tmp_path / "reports" / "r" / "report.json").write_text('{"seed": 1}')
    (tmp_path / "reports" / "r" / "notes.txt").write_text("x")
    (tmp_path / "secret.json").write_text("{}")
    folder = ReportsFolder(str(tmp_path / "reports"))

    assert await folder.read("r", "report.json") == (b'{"seed": 1}', b"application/json")
    with pytest.raises(RouteNotFoundError):
        await folder.read(report, name)
