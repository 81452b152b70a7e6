"""Persistence, used only by the owning actor: the shared SQLite file and its tables.

``db`` (the file, WAL, migrations), ``api_keys`` (gateway API keys),
``provider_keys`` (database-added provider keys and reservations), ``snapshots``
(what outlives a restart) and ``request_log`` (the request log's table).

Also here: ``limits``, ``spend_report``; and, for a cluster, ``api_keys_snapshot`` and
``limits_snapshot`` (the same state as snapshots of the owning unit, in JetStream).
"""

from __future__ import annotations

# Its modules are imported by name; nothing is re-exported here.
__all__: list[str] = []
