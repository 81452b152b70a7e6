"""The message bus: the ``Bus`` protocol, its two implementations, and the wire codec.

Owns how messages travel between actors and the ingress: subject semantics (NATS's ``*``,
``>``, queue groups, request/reply, no-responders), the msgspec JSON encoding of every
``schemas.Message``, and the mapping of transport failures to ``bus.errors``.
``open_bus(url)`` picks ``InProcessBus`` (``inproc://``, the default) or ``NatsBus``
(``nats://``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bus.codec import CodecError, decode, decode_reply, encode
from bus.errors import BusClosedError, NoRespondersError, RequestTimeoutError
from bus.inprocess import InProcessBus, Mailbox
from bus.kv import KeyValue, KvConflictError, KvEntry
from bus.protocol import Bus, Envelope, Subscription

if TYPE_CHECKING:
    from bus.nats_bus import NatsBus

_SCHEMES = ("inproc://", "nats://")


async def open_bus(
    url: str,
    *,
    name: str | None = None,
    connect_timeout: float = 5.0,
    inbox_prefix: str | None = None,
    families: tuple[str, ...] = (),
) -> Bus:
    """Open the bus ``url`` names: ``inproc://`` (or empty) or ``nats://host:port[,...]``.

    On NATS, replies come back under ``inbox_prefix`` (default ``_INBOX_<user>`` for the URL's
    user, see ``bus.inbox.inbox_prefix_for``). Raises ValueError for any other scheme or an
    unusable inbox prefix, BusClosedError when no NATS server accepts within
    ``connect_timeout`` seconds. ``families``: see ``NatsBus.connect`` (the in-process bus
    needs none: it hands a message to each local subscriber once anyway).
    """
    if not url or url.startswith("inproc://"):
        return InProcessBus()
    if url.startswith("nats://"):
        from bus.nats_bus import NatsBus

        return await NatsBus.connect(
            url,
            name=name,
            connect_timeout=connect_timeout,
            inbox_prefix=inbox_prefix,
            families=families,
        )
    # Only the scheme is quoted: the rest of a URL may hold its password.
    scheme = url.partition("://")[0] if "://" in url else url[:16]
    raise ValueError(
        f"unsupported bus url scheme {scheme!r}: expected one of {', '.join(_SCHEMES)}"
    )


def __getattr__(name: str) -> object:
    """``NatsBus``, imported on first use: ``nats`` (with aiohttp) costs every process that
    never speaks NATS (the CLI's commands, an in-process gateway) about 0.4 s of start-up."""
    if name == "NatsBus":
        from bus.nats_bus import NatsBus

        return NatsBus
    raise AttributeError(f"module 'bus' has no attribute {name!r}")


__all__ = [
    "Bus",
    "BusClosedError",
    "CodecError",
    "Envelope",
    "InProcessBus",
    "KeyValue",
    "KvConflictError",
    "KvEntry",
    "Mailbox",
    "NatsBus",
    "NoRespondersError",
    "RequestTimeoutError",
    "Subscription",
    "decode",
    "decode_reply",
    "encode",
    "open_bus",
]
