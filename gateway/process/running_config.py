"""The config text a ``llmgw serve --workers N`` run serves, kept by its supervisor.

A worker started later (a restart after a crash) is given this text on its stdin rather than
reading the file as it is then: an edit not reloaded yet, or one that does not validate, must
not reach one worker alone (a broken one would keep the replacement from starting until the
restart budget stopped the whole gateway). The text is the file's at start, then the file's
at each reload the actors applied (``ConfigChanged`` naming the version of that text).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from schemas import ConfigChanged, subjects

if TYPE_CHECKING:
    from bus import Bus


def text_version(text: str) -> str:
    """A config text's version: a short hash of it (as ``ConfigChanged.version``)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _read(path: str | None) -> str | None:
    if path is None:
        return None  # the bundled demo config: it does not change
    try:
        return Path(path).read_text()
    except OSError:
        return None


class RunningConfig:
    """Owns the text of the config version the actors run (None: read the file)."""

    def __init__(self, path: str | None) -> None:
        self._path = path
        self.text = _read(path)

    async def follow(self, bus: Bus) -> None:
        """Take the file's text at each reload the actors applied, until cancelled. Raises
        BusClosedError when the bus ends the subscription."""
        async with bus.subscribe(subjects.event("config")) as sub:
            async for env in sub:
                if isinstance(env.message, ConfigChanged):
                    text = _read(self._path)
                    # Edited again since that reload: not what the actors run; keep the last.
                    if text is not None and text_version(text) == env.message.version:
                        self.text = text
