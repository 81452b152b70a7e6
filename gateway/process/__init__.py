"""Running a gateway process: config loading, serving, reload, and the work beside the
actors.

``config`` (loading and validating the YAML), ``serve`` (open the bus, start the
tree, serve HTTP), ``control`` (the operator side of a process, SIGHUP), ``reload``
(config reload, ingress side), ``sidecars``, ``healthcheck`` and ``prober`` (upstream
I/O that actors never do themselves). Only this package (``actor_host``) and the CLI's
offline paths import ``actors``.

Also here: ``actor_host``, ``quota_poller``, ``routewise_prober``, ``engines`` (the HTTP
server under the app: Hypercorn or granian), ``startup`` (how a process knows its HTTP side
answers, or why it did not), and ``llmgw serve --workers N``: ``workers`` (the supervisor),
``worker_pool`` (its workers), ``worker`` (one ingress worker), ``running_config`` (the
config text a restarted worker is given), ``embedded_nats`` (their private bus),
``port_claim`` (one run per port) and ``cores`` (``--workers auto``).
"""

from __future__ import annotations

# Its modules are imported by name; nothing is re-exported here.
__all__: list[str] = []
