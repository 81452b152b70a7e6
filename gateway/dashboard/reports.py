"""Replay reports for the dashboard: the ``llmgw replay --out`` folders inside
``dashboard.reports_dir``, each holding ``report.json``, ``report.md`` and its plots
(``*.png``/``*.svg``). Read-only, and only these files: a name is one path segment of safe
characters, never a path, so nothing outside the folder can be named."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from schemas import RouteNotFoundError

REPORT = "report.json"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_TYPES = {
    ".json": b"application/json",
    ".md": b"text/markdown; charset=utf-8",
    ".png": b"image/png",
    ".svg": b"image/svg+xml",
}
MAX_BYTES = 20 * 1024 * 1024  # a plot or report larger than this is not served
MAX_REPORTS = 200  # the newest listed


def _safe(name: str) -> bool:
    return bool(_NAME.fullmatch(name)) and ".." not in name


class ReportsFolder:
    """The reports under one folder (``None``: none configured). Raises RouteNotFoundError
    for a report or file it does not hold."""

    def __init__(self, folder: str | None) -> None:
        self._root = Path(folder) if folder else None

    async def listing(self) -> dict[str, Any]:
        """``{"configured", "reports": [{"name", "modified", "files"}]}``, newest first."""
        if self._root is None:
            return {"configured": False, "reports": []}
        return {"configured": True, "reports": await asyncio.to_thread(self._scan, self._root)}

    @staticmethod
    def _scan(root: Path) -> list[dict[str, Any]]:
        found: list[tuple[float, str, list[str]]] = []
        try:
            folders = [p for p in root.iterdir() if p.is_dir() and _safe(p.name)]
        except OSError:
            return []
        for folder in folders:
            report = folder / REPORT
            if not report.is_file():
                continue
            files = sorted(
                p.name
                for p in folder.iterdir()
                if p.is_file() and _safe(p.name) and p.suffix in _TYPES
            )
            found.append((report.stat().st_mtime, folder.name, files))
        found.sort(key=lambda r: (-r[0], r[1]))
        return [{"name": n, "modified": m, "files": f} for m, n, f in found[:MAX_REPORTS]]

    async def read(self, report: str, name: str) -> tuple[bytes, bytes]:
        """The bytes and content type of file ``name`` of report ``report``."""
        if self._root is None or not (_safe(report) and _safe(name)):
            raise RouteNotFoundError("no such report file")
        content_type = _TYPES.get(Path(name).suffix)
        if content_type is None:
            raise RouteNotFoundError("no such report file")
        path = self._root / report / name
        try:
            body = await asyncio.to_thread(_read, path)
        except (OSError, ValueError):
            raise RouteNotFoundError(f"no report file {report}/{name}") from None
        return body, content_type


def _read(path: Path) -> bytes:
    if not path.is_file() or path.stat().st_size > MAX_BYTES:
        raise ValueError(path)
    return path.read_bytes()
