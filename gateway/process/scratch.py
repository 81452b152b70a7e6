"""Scratch directories of one ``llmgw serve --workers`` run, and the sweep of a dead run's.

A run keeps its private nats-server's configuration (this run's bus password) and its
workers' metrics files in temporary directories it removes when it stops. A supervisor
killed (kill -9, the OOM killer) cannot remove them; so each is named after the process that
made it, and the next run removes those whose process is gone.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

NATS_PREFIX = "llmgw-nats-"
METRICS_PREFIX = "llmgw-metrics-"
_OWNED = re.compile(r"^(llmgw-nats-|llmgw-metrics-)(\d+)-")


def make_scratch(prefix: str) -> Path:
    """A new directory of mode 0700 in the temporary directory, named after this process
    (``<prefix><pid>-<random>``)."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to judge
        return True
    # A killed run whose parent has not reaped it yet (a container's first process may
    # never) still answers kill(0): a zombie has ended all the same.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] != "Z"


def sweep_dead_runs(root: Path | None = None) -> list[Path]:
    """Remove the scratch directories in ``root`` (the temporary directory) that this user
    owns and whose process is gone; returns those removed. Never raises: a directory that
    cannot be read or removed is left as it is."""
    root = root or Path(tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        named = _OWNED.match(entry.name)
        if named is None or _alive(int(named.group(2))):
            continue
        try:
            if entry.is_symlink() or not entry.is_dir() or entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            removed.append(entry)
    if removed:
        logger.info("removed %d scratch directories of runs no longer running", len(removed))
    return removed
