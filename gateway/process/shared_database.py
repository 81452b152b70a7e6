"""The startup check of an actor host among several: the request log must be shared.

With one actor host, the request log and the spend may live in its SQLite file
(``database.path``). Once several hosts may own the StoreActor (``llmgw serve --role actors``
on more than one host), each would write its own file and ``llmgw logs``, ``spend report``
and the dashboard would see a part of the traffic, so a host that finds others refuses to
start and names the remedy: ``database.url`` (PostgreSQL), the same on every host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.process.config import ConfigError

if TYPE_CHECKING:
    from collections.abc import Collection

    from schemas.config import GatewayConfig


class SharedDatabaseRequiredError(ConfigError):
    """Several actor hosts, and the request log in a file only one of them can reach."""


def require_shared_database(config: GatewayConfig, hosts: Collection[str], *, node_id: str) -> None:
    """Refuse to start actor host ``node_id`` when ``hosts`` (the live actor hosts' ids, this
    one included or not) holds another and ``config`` keeps the request log in SQLite.

    Raises SharedDatabaseRequiredError naming the other hosts and the remedy.
    """
    others = sorted(h for h in hosts if h != node_id)
    if not others or config.database.url or not config.log.enabled:
        return
    shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    raise SharedDatabaseRequiredError(
        f"other actor hosts are running ({shown}) and the request log is in this host's "
        f"SQLite file ({config.database.path}): several actor hosts need a shared database: "
        "set database.url: postgresql://USER:PASSWORD@HOST:PORT/DB (or LLMGW_DATABASE_URL) "
        "to the same PostgreSQL on every actor host, or run a single actor host"
    )
