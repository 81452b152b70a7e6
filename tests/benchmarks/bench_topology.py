"""The gateway's process topology in ``bench.py``: what runs, with which config, and when the
split processes are ready to be measured.

- ``one`` (the default): one ``llmgw serve`` (ingress and actors in one process), on whatever
  bus ``--bus`` names.
- ``split`` (``--roles split``, a NATS bus only): one ``llmgw serve --role actors`` and one
  ``llmgw serve --role ingress`` on the same config and bus, as a scaled-out deployment runs
  them; requests cross the bus between two processes instead of staying in one.
- ``split+cluster`` (``--roles split --cluster``): the same with ``cluster: {enabled: true}``,
  so the one actors host heartbeats into JetStream, owns its units under fencing revisions
  and keeps its snapshots in JetStream key-value buckets (heartbeat and TTL at their
  defaults, replicas as the one server allows: R1). One actors host may keep the request log
  in its SQLite file (a second one would need ``database.url``), so it does unless
  ``--postgres`` puts it in PostgreSQL, as a cluster of several hosts must.

- ``workers=N`` (``--workers N``): one ``llmgw serve --workers N``, a supervisor running the
  actors with N ingress workers and (unless ``--bus`` names one) its own nats-server.

The gateway's CPU figure of a row is the sum of every process of its topology (the ingress,
the actors host, a nats-server the script started), each with every process under it (a
supervisor's workers and nats-server).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

ROLES = ("one", "split")
# The processes whose CPU is the gateway's, by the name the load generator watches them as.
GATEWAY_PROCESSES = ("gateway", "actors", "nats")
ACTORS_NODE_ID = "bench-actors"
_POLL_S = 0.1


def topology_label(roles: str, cluster: bool, workers: str = "1") -> str:
    """What a gateway row says it measured: ``one``, ``split``, ``split+cluster`` or, for
    ``llmgw serve --workers N``, ``workers=N``."""
    if workers != "1":
        return f"workers={workers}"
    return f"{roles}+cluster" if cluster else roles


def topology_problem(*, roles: str, cluster: bool, bus: str, workers: str) -> str | None:
    """Why these options cannot run together, or None when they can."""
    on_nats = bus == "nats" or bus.startswith("nats://")
    if cluster and roles != "split":
        return "--cluster needs --roles split (cluster mode is for llmgw serve --role actors)"
    if roles == "split" and not on_nats:
        return "--roles split needs a NATS bus (--bus nats or --bus nats://HOST:PORT)"
    if roles == "split" and workers != "1":
        return "--roles split runs one ingress; --workers runs its own processes: pick one"
    return None


def topology_config(cluster: bool, database_url: str | None = None) -> str:
    """The config lines the topology adds to the benchmark's gateway config (YAML): cluster
    mode, and the request log in the PostgreSQL at ``database_url`` (None: SQLite)."""
    text = "cluster: {enabled: true}\n" if cluster else ""
    return text + (f"database: {{url: {json.dumps(database_url)}}}\n" if database_url else "")


def role_args(role: str, bus_url: str) -> list[str]:
    """The ``llmgw serve`` arguments after ``--config`` for ``role`` (``all``, ``ingress``
    or ``actors``) on ``bus_url``: an actors host listens on no port."""
    if role == "actors":
        return ["--bus", bus_url, "--role", "actors", "--node-id", ACTORS_NODE_ID]
    args = ["--port", "0", "--bus", bus_url]
    return args if role == "all" else [*args, "--role", role]


def cluster_settled(answer: dict[str, Any]) -> bool:
    """Whether a ``cluster/members`` answer shows placement done: a live host owns units and
    none is left unowned (a claim or a start under way)."""
    members = answer.get("members") or []
    owned = sum(len(m.get("units") or []) for m in members)
    return bool(members) and owned > 0 and not answer.get("unowned")


def wait_cluster_settled(gateway_url: str, admin_key: str, timeout: float) -> dict[str, Any]:
    """The ingress's ``GET /admin/cluster/members`` once :func:`cluster_settled`. Raises
    RuntimeError with the last answer after ``timeout`` seconds."""
    req = urllib.request.Request(
        f"{gateway_url}/admin/cluster/members", headers={"authorization": f"Bearer {admin_key}"}
    )
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:  # loopback only
                answer = json.loads(resp.read())
            if cluster_settled(answer):
                return dict(answer)
            last = answer
        except (OSError, ValueError) as exc:  # 503 while the admin actors start, too
            last = exc
        time.sleep(_POLL_S)  # the units are claimed on the host's own beats: poll the outcome
    raise RuntimeError(f"cluster placement not settled in {timeout:g} s: {last}")


def until_served(
    check: Callable[[], None], timeout: float, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Call ``check`` (one request that raises RuntimeError unless served) until it passes:
    an ingress answers 503 until the actors it asks run. Raises its last RuntimeError after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            check()
            return
        except RuntimeError:
            if time.monotonic() >= deadline:
                raise
        sleep(_POLL_S)
