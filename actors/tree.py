"""build_tree(config): the one place actors are wired into a supervision tree.

    root (one_for_one)
    ├── store: StoreActor (the request log, with ``request_log=True`` and ``log.enabled``;
    │          starts first and stops last, so it sees every other child's traffic)
    ├── endpoints (one_for_one): EndpointActor per endpoint id
    ├── keys      (one_for_one): KeyRegistryActor (admin area provider_keys), then a
    │             KeyPoolActor per endpoint id
    ├── capacity  (one_for_one): CapacityActor per capacity pool (quota units, concurrency
    │             slots; leases granted to decisions and ingresses)
    ├── models    (one_for_one): ModelActor per public model
    ├── health: HealthActor (read model for /health/deep)
    ├── routing_admin: RoutingAdminActor (admin areas routing and bench, forwarded to owners)
    ├── api_keys: ApiKeyAdminActor (admin area api_keys: gateway API keys)
    ├── limits: LimitsActor (admin area limits: every rate limit, slot and budget)
    ├── rules: RulesActor (admin area rules: the routing rule set, persisted and published)
    ├── degraded_mode: DegradedModeActor (healthy ratio -> normal/degraded, no flapping)
    └── steering: SteeringActor (admin areas chains and steering, scoring evidence; runs a
                  ChainActor per chain)

Endpoints start first so models and the health view can seed their views from them;
capacity pools start before the models, which seed their capacity views from them.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING

from actors.apikey_admin import ApiKeyAdminActor
from actors.capacity import CapacityActor
from actors.child_spec import ChildSpec, Restart, Strategy
from actors.degraded import DegradedModeActor
from actors.endpoint import EndpointActor
from actors.health import HealthActor
from actors.keypool import keys_supervisor
from actors.limits import LimitsActor
from actors.model import ModelActor
from actors.routewise_settings import RouteWiseSettingsActor
from actors.routing_admin import RoutingAdminActor
from actors.rules import RulesActor
from actors.state.route_table import candidate_for
from actors.steering import SteeringActor
from actors.store import StoreActor
from actors.supervisor import Supervisor
from schemas.capacity import capacity_pools
from schemas.limits import LimitsConfig

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.stores.snapshots import SnapshotStore
    from schemas.config import GatewayConfig


def build_tree(
    config: GatewayConfig,
    *,
    snapshots: SnapshotStore | None = None,
    clock: Callable[[], float] | None = None,
    request_log: bool = False,
    seed: int | None = None,
    shared_state: bool = False,
) -> Supervisor:
    """The root supervisor for ``config``; start it with ``await root.start(bus)``.

    ``clock`` (Unix seconds) is every actor's and supervisor's time; ``seed`` makes the
    strategies' random draws repeatable (the replay's; production leaves both unset).
    ``shared_state`` (a cluster of actors hosts): the gateway API keys, the limits and the
    budgets live in ``snapshots`` (JetStream, which every host reads) instead of the SQLite
    file at ``database.path``, which only the host that wrote it could read; the
    database-added provider keys (secrets) in the PostgreSQL database at ``database.url``
    when one is configured."""
    circuit = config.routing.circuit
    endpoint_specs: list[ChildSpec | Supervisor] = []
    model_specs: list[ChildSpec | Supervisor] = []
    all_endpoints: list[str] = []
    extra = {"clock": clock} if clock is not None else {}
    shared = snapshots if shared_state else None
    for model in config.models:
        for eid, route in zip(model.endpoint_ids(), model.route, strict=True):
            all_endpoints.append(eid)
            endpoint_specs.append(
                ChildSpec(
                    f"endpoint:{eid}",
                    functools.partial(
                        EndpointActor,
                        eid,
                        model.id,
                        circuit,
                        bench=config.routing.bench,
                        candidate=candidate_for(eid, route),
                        probe_timeout=max(route.timeout_seconds, route.ttft_timeout_seconds),
                        snapshots=snapshots,
                        **extra,
                    ),
                    restart=Restart.PERMANENT,
                )
            )
        model_specs.append(
            ChildSpec(
                f"model:{model.id}",
                functools.partial(
                    ModelActor, model, config.routing, snapshots=snapshots, seed=seed, **extra
                ),
                restart=Restart.PERMANENT,
            )
        )
    timeouts = {
        eid: route.timeout_seconds
        for m in config.models
        for eid, route in zip(m.endpoint_ids(), m.route, strict=True)
    }
    leases = config.routing.leases
    capacity_specs: list[ChildSpec | Supervisor] = [
        ChildSpec(
            f"capacity:{name}",
            functools.partial(
                CapacityActor,
                spec,
                leases,
                snapshots=snapshots,
                max_age=leases.max_age(timeouts[e] for e in spec.endpoints),
                **extra,
            ),
            # Two owners of one pool would both grant: a reload swaps them exactly.
            restart=Restart.PERMANENT,
            exclusive=True,
        )
        for name, spec in capacity_pools(config).items()
    ]
    store = (
        [
            ChildSpec(
                "store",
                functools.partial(StoreActor, config.database, config.log),
                shutdown=10.0,
            )
        ]
        if request_log and config.log.enabled
        else []
    )
    return Supervisor(
        "root",
        strategy=Strategy.ONE_FOR_ONE,
        intensity=10,
        period=5.0,
        clock=clock,
        children=[
            *store,
            Supervisor(
                "endpoints",
                strategy=Strategy.ONE_FOR_ONE,
                intensity=10,
                period=5.0,
                children=endpoint_specs,
            ),
            keys_supervisor(
                config,
                clock=clock,
                snapshots=snapshots,
                # Not the snapshots: those are readable by any NATS user allowed on $JS.
                shared_url=config.database.url if shared_state else None,
            ),
            Supervisor(
                "capacity",
                strategy=Strategy.ONE_FOR_ONE,
                intensity=10,
                period=5.0,
                children=capacity_specs,
            ),
            # Before the models: a ModelActor asks it for the admin's settings as it starts.
            ChildSpec(
                "routewise_settings",
                functools.partial(
                    RouteWiseSettingsActor,
                    config.models,
                    config.routing.default_router,
                    snapshots=snapshots,
                    **extra,
                ),
            ),
            Supervisor(
                "models",
                strategy=Strategy.ONE_FOR_ONE,
                intensity=10,
                period=5.0,
                children=model_specs,
            ),
            ChildSpec("health", functools.partial(HealthActor, tuple(all_endpoints))),
            ChildSpec(
                "routing_admin",
                functools.partial(
                    RoutingAdminActor, tuple(m.id for m in config.models), tuple(all_endpoints)
                ),
            ),
            ChildSpec(
                "api_keys",
                functools.partial(ApiKeyAdminActor, config.database.path, state=shared),
            ),
            # Only the owner's own settings: a reload that changes how ingresses ask
            # (fail_open, timeouts) must not replace the owner of every counter. Exclusive:
            # a replacement loads the counters the old owner saved when it stopped, and two
            # owners would each admit up to the limit.
            ChildSpec(
                "limits",
                functools.partial(
                    LimitsActor,
                    config.database.path,
                    LimitsConfig(
                        lease_ttl_seconds=config.limits.lease_ttl_seconds,
                        snapshot_seconds=config.limits.snapshot_seconds,
                    ),
                    clock=clock or time.time,
                    state=shared,
                ),
                exclusive=True,
            ),
            ChildSpec("rules", functools.partial(RulesActor, snapshots=snapshots, **extra)),
            ChildSpec(
                "degraded_mode",
                functools.partial(
                    DegradedModeActor,
                    tuple(all_endpoints),
                    config.routing.degraded,
                    circuit.min_availability,
                    **extra,
                ),
            ),
            ChildSpec(
                "steering",
                functools.partial(
                    SteeringActor,
                    config.models,
                    config.chains,
                    config.steering,
                    snapshots=snapshots,
                    **extra,
                ),
            ),
        ],
    )
