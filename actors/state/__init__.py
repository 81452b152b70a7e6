"""Pure state machines the actors own: no I/O, no bus, no clock of their own.

``circuit`` (health EWMA and circuit breaker), ``keypool`` (a route's keys and mutes),
``affinity``, ``prefill``, ``backoff``, ``quota``, ``scoring`` (the evidence book),
``evidence_gate`` (when the evidence is published), ``route_table`` and
``steering_settings``. Each is fed and persisted by one actor.

Also here: ``capacity_ledger``, ``limit_counters``, ``limit_leases``, ``log_aggregates``.
"""

from __future__ import annotations

# Its modules are imported by name; nothing is re-exported here.
__all__: list[str] = []
