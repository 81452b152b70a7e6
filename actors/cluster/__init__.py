"""Several actor hosts on one NATS cluster: membership, placement with fencing, takeover.

``ClusterHost`` (host.py) runs this host's share of the tree; ``Membership`` (heartbeats in
a bucket with a TTL), ``owner_of``/``Owners`` (rendezvous placement, leases by
compare-and-set), ``FencedSnapshots`` (snapshots in JetStream, written only under a held
lease) and ``liveness``/``GatedBus`` (a dead host told from a slow one over core NATS, and
a host answering only within its serving lease) are its parts; ``ClusterConfigActor``
carries a config reload to every host. Used only when ``cluster.enabled`` and the bus is
NATS; the embedded default (in-process bus, SQLite snapshots) never loads it.
"""

from __future__ import annotations

from actors.cluster.config import ClusterConfigActor
from actors.cluster.fenced import SNAPSHOTS_BUCKET, FencedSnapshots
from actors.cluster.host import ClusterHost
from actors.cluster.membership import HOSTS_BUCKET, Membership
from actors.cluster.placement import OWNERS_BUCKET, Lease, Owners, owner_of

__all__ = [
    "HOSTS_BUCKET",
    "OWNERS_BUCKET",
    "SNAPSHOTS_BUCKET",
    "ClusterConfigActor",
    "ClusterHost",
    "FencedSnapshots",
    "Lease",
    "Membership",
    "Owners",
    "owner_of",
]
