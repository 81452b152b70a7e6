"""How ``llmgw keys`` reaches the owner of the keys (and of their limits) on the database it
was given, and when it may write that database itself.

The rule (README, state ownership): while a gateway runs on the database, the keys and limits
in it are its owners'; the CLI writes the file only when no gateway runs on it. So:

- the config's NATS bus first, when it names one: an owner answering there takes the command;
- else (no bus, nobody on it, or it cannot be joined) the local socket beside the database;
- a socket that answers means a gateway runs on this file: a command it cannot deliver to
  the owner (its bus reconnecting, the owner silent) fails with
  :class:`OwnerUnreachableError`, never the file, and one that timed out may have been
  applied already (the outcome is unknown);
- only when neither a bus owner nor the socket answers does :class:`NoGatewayError` let the
  caller use the offline path (``gateway.cli.keys_offline``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from gateway.admin.http import ADMIN_TIMEOUT_S, admin_request
from gateway.admin.local_socket import answers, socket_path
from gateway.cli.common import NotDeliveredError, Target, admin_over_http, not_reached
from gateway.process.config import redacted
from schemas import BusTimeoutError, Message, NoRespondersError, subjects

logger = logging.getLogger(__name__)

_ANNOUNCE_TIMEOUT = 3.0
_CONNECT_TIMEOUT = 3.0
# Past the gateway's own admin timeout, so that its answer (bus_timeout) arrives first.
_SOCKET_TIMEOUT = ADMIN_TIMEOUT_S + 5.0
_BY = "cli:keys"


class NoGatewayError(Exception):
    """No gateway answered, on the bus nor on the database's socket: the offline path applies."""


async def reach_owner(
    path: str, bus_url: str, verb: str, values: dict[str, Any], *, area: str = "api_keys"
) -> tuple[dict[str, Any], str]:
    """The running owner's answer to ``<area> <verb>`` and how it went (``bus``, ``socket``).
    Raises NoGatewayError when no gateway answers at all, OwnerUnreachableError when one runs
    but the owner is not reached, RefusedError / GatewayError when the owner refuses,
    httpx.HTTPError when the socket's gateway goes away mid-command."""
    if bus_url:
        try:
            return await _over_bus(bus_url, area, verb, values), "bus"
        except NoGatewayError as exc:
            if not path:
                raise
            logger.info("no owner on %s (%s); trying the local socket", redacted(bus_url), exc)
    return await _over_socket(path, area, verb, values), "socket"


async def _over_bus(url: str, area: str, verb: str, values: dict[str, Any]) -> dict[str, Any]:
    """Raises NoGatewayError when the bus cannot be joined or no actors answer on it,
    OwnerUnreachableError when they took the command and did not answer in time."""
    from bus import BusClosedError, open_bus

    try:
        bus = await open_bus(url, name="llmgw-keys-cli", connect_timeout=_CONNECT_TIMEOUT)
    except BusClosedError as exc:
        raise NoGatewayError(exc.message) from None
    try:
        return await admin_request(bus, area, verb, values, by=_BY, timeout=ADMIN_TIMEOUT_S)
    except NoRespondersError as exc:  # the actors are down, or this connection was lost
        raise NoGatewayError(exc.message) from None
    except BusTimeoutError as exc:
        raise not_reached(redacted(url), area, verb, exc.message, timed_out=True) from None
    finally:
        await bus.aclose()


async def _over_socket(path: str, area: str, verb: str, values: dict[str, Any]) -> dict[str, Any]:
    """Raises NoGatewayError when nothing answers the socket, OwnerUnreachableError when the
    gateway there does not deliver the command."""
    sock = socket_path(path)
    if not answers(sock):
        raise NoGatewayError(f"no gateway answers on {sock}")
    where = Target(socket=str(sock))
    try:
        return await asyncio.to_thread(admin_over_http, where, area, verb, values, _SOCKET_TIMEOUT)
    except NotDeliveredError as exc:
        timed_out = exc.code == "bus_timeout"
        raise not_reached(path, area, verb, str(exc), timed_out=timed_out) from None
    except httpx.TimeoutException:
        raise not_reached(path, area, verb, "no answer", timed_out=True) from None
    except (httpx.ReadError, httpx.RemoteProtocolError):  # sent: it may have run
        closed = "the connection closed before the answer"
        raise not_reached(path, area, verb, closed, timed_out=True) from None


async def announce(bus_url: str, msg: Message) -> None:
    """After an offline change: tell ingresses on the NATS bus (if any) to drop the key."""
    if not bus_url:
        return
    from bus import open_bus

    try:
        async with asyncio.timeout(_ANNOUNCE_TIMEOUT):
            bus = await open_bus(bus_url, name="llmgw-keys-cli")
            try:
                await bus.publish(subjects.AUTH_KEYS_CHANGED, msg)
            finally:
                await bus.aclose()
    except Exception as exc:  # the database change stands; the caches expire on their own
        logger.warning(
            "could not announce on %s (%s); ingresses apply it within their auth_cache_seconds",
            redacted(bus_url),
            exc,
        )
