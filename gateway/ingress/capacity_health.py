"""The ``capacity`` section of ``/health/deep``: one line per capacity pool, read from its
owner (a ``CapacityGet`` each; not the hot path)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bus import Bus, NoRespondersError, RequestTimeoutError
from schemas import CapacityGet, CapacityState, subjects
from schemas.capacity import capacity_pools

if TYPE_CHECKING:
    from collections.abc import Callable

    from schemas.config import GatewayConfig


async def capacity_lines(
    bus: Bus, config: GatewayConfig, visible: Callable[[str], bool], timeout: float
) -> tuple[dict[str, Any], bool]:
    """Per pool whose routes ``visible`` lets the caller see (by endpoint): kind, limit, used,
    free, unit, resets_at, resolved and reason, and its routes; and whether any pool is
    unresolved (or its owner does not answer)."""
    lines: dict[str, Any] = {}
    unresolved = False
    for name, spec in capacity_pools(config).items():
        routes = [e for e in spec.endpoints if visible(e)]
        if not routes:
            continue
        try:
            st = await bus.request(
                subjects.capacity_get(name),
                CapacityGet(pool=name),
                reply_type=CapacityState,
                timeout=timeout,
            )
        except (NoRespondersError, RequestTimeoutError) as exc:
            unresolved = True
            lines[name] = {
                "kind": spec.kind,
                "resolved": False,
                "routes": routes,
                "reason": f"the pool's owner does not answer ({type(exc).__name__})",
            }
            continue
        assert isinstance(st, CapacityState)
        unresolved = unresolved or not st.resolved
        lines[name] = {
            "kind": st.kind,
            "limit": st.limit,
            "used": st.used,
            "free": st.free,
            "unit": st.unit,
            "resets_at": st.resets_at,
            "resolved": st.resolved,
            "reason": st.reason,
            "routes": routes,
        }
    return lines, unresolved
