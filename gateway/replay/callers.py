"""The gateway API keys a replay's requests present: created (with their limits) through
their owners' admin areas on the bus before the traffic, as an operator would."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.replay.trace import TraceKey
from schemas import AdminCommand, AdminReply, raise_for_reply, subjects

if TYPE_CHECKING:
    from collections.abc import Sequence

    from bus import Bus
    from gateway.replay.trace import TraceRequest

_TIMEOUT = 30.0  # real seconds: keys are made before the traffic, SQLite on a thread


def declared_keys(keys: Sequence[TraceKey], trace: Sequence[TraceRequest]) -> list[TraceKey]:
    """``keys``, then a key of role ``free`` without limits for every other key a request
    of ``trace`` names, in order of first use."""
    out = list(keys)
    known = {k.name for k in keys}
    for r in trace:
        if r.key and r.key not in known:
            known.add(r.key)
            out.append(TraceKey(name=r.key))
    return out


async def create_keys(bus: Bus, keys: Sequence[TraceKey]) -> dict[str, str]:
    """Create each key (``api_keys create``) and set its limits (``limits set``); the
    secret of each key by name. Raises the owners' GatewayError (a bad role or limit)."""
    secrets: dict[str, str] = {}
    for k in keys:
        who = {"org": k.org, "user": k.name, "role": k.role, "name": k.name}
        made = await _admin(bus, "api_keys", "create", who)
        secrets[k.name] = str(made["key"])
        if k.limits is not None:
            spec = msgspec.to_builtins(k.limits)
            await _admin(bus, "limits", "set", {"subject": f"key:{made['id']}", **spec})
    return secrets


async def _admin(bus: Bus, area: str, verb: str, args: dict[str, Any]) -> dict[str, Any]:
    reply = await bus.request(
        subjects.admin(area, verb),
        AdminCommand(args=args, by="replay"),
        reply_type=AdminReply,
        timeout=_TIMEOUT,
    )
    return raise_for_reply(reply).result
