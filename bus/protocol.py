"""The Bus protocol every implementation satisfies; the Envelope subscribers receive lives
with the wire format (``bus.codec``) and is named here for the protocol's signatures."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

from bus.codec import Envelope

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from contextlib import AbstractAsyncContextManager

    from bus.kv import KeyValue
    from schemas import ErrorReply, Message

T = TypeVar("T")

__all__ = ["Bus", "Envelope", "Sink", "Subscription"]


class Subscription(Protocol):
    """An active subscription: iterate it for Envelopes until it is closed."""

    subject: str

    def __aiter__(self) -> AsyncIterator[Envelope]: ...

    async def feed(self, sink: Sink) -> None:
        """Put every Envelope into ``sink``, in order, until the subscription is closed."""
        ...


class Sink(Protocol):
    """Where ``Subscription.feed`` puts Envelopes: an actor's ``Mailbox``, an asyncio.Queue."""

    def put_nowait(self, item: Envelope, /) -> None:
        """Queue ``item``. Raises asyncio.QueueFull when full."""
        ...

    async def put(self, item: Envelope, /) -> None:
        """Queue ``item``, first waiting for room."""
        ...


class Bus(Protocol):
    """Publish/subscribe and request/reply with NATS subject semantics, and kept history.

    History (JetStream on NATS, a bounded in-memory copy in process): :meth:`ensure_stream`
    keeps what is published on some subjects, :meth:`replay` subscribes from a past instant.
    Raises (from ``bus.errors``): ``NoRespondersError`` when a request has no subscriber,
    ``RequestTimeoutError`` when its reply is late, ``BusClosedError`` after ``aclose``.
    """

    @property
    def closed(self) -> bool:
        """True after ``aclose`` (or once the bus is closed for good): no call succeeds again."""
        ...

    @property
    def connected(self) -> bool:
        """True while a message sent now reaches the servers; False while the connection is
        lost and being re-established (what is sent meanwhile waits, or is lost) or closed."""
        ...

    @property
    def servers(self) -> int:
        """How many servers the bus knows in its cluster (the ones given and the ones the
        servers announced); 1 in one process."""
        ...

    async def reconnected(self) -> None:
        """Return the next time the connection to the server is back after a loss: its
        subscriptions hear again, but what was published meanwhile is lost, so a view fed by
        events asks its owner again. Never returns on a bus that cannot lose one."""
        ...

    async def disconnected(self) -> None:
        """Return once the connection to the server is lost: at once while it is lost (or
        closed for good), else at the next loss. A request then waiting for its reply may
        never get it (a reply sent meanwhile is lost) and waits out its timeout: a caller
        with a long one races its request with this. Never returns on a bus that cannot lose
        one (in one process, where ``aclose`` fails pending requests itself)."""
        ...

    async def publish(self, subject: str, msg: Message) -> None:
        """Fire-and-forget ``msg`` to every subscriber of ``subject``."""
        ...

    async def request(
        self, subject: str, msg: Message, *, reply_type: type[T], timeout: float
    ) -> T | ErrorReply:
        """Send ``msg`` to one subscriber of ``subject`` and return its reply."""
        ...

    def subscribe(
        self, subject: str, *, queue: str | None = None
    ) -> AbstractAsyncContextManager[Subscription]:
        """Subscribe to ``subject`` (``*`` and ``>`` wildcards); ``queue`` load-balances."""
        ...

    async def ensure_stream(
        self,
        name: str,
        subjects: list[str],
        *,
        max_age: float,
        max_msgs: int,
        max_msgs_per_subject: int | None = None,
        replicas: int = 1,
        memory: bool = False,
        grow_only: bool = False,
    ) -> None:
        """Keep what is published on ``subjects`` as the stream ``name``, for ``max_age``
        seconds and at most ``max_msgs`` messages (``max_msgs_per_subject`` of one subject:
        its oldest go first), in ``replicas`` copies on a JetStream cluster (create it, or
        update it to this config; ``grow_only``: an existing stream keeps more copies than
        that); ``memory``: in the servers' memory rather than their files (a stream that
        need not outlive the servers). Raises BusClosedError when the bus cannot keep it."""
        ...

    async def delete_stream(self, name: str) -> None:
        """Stop keeping the stream ``name`` and drop what it kept (a missing one is fine)."""
        ...

    def replay(
        self, subject: str, *, stream: str, since: float
    ) -> AbstractAsyncContextManager[Subscription]:
        """Subscribe to ``subject`` through ``stream``: what it kept from ``since`` (epoch
        seconds) on, then live messages, in order. Raises ValueError, BusClosedError (also
        when the stream does not exist)."""
        ...

    async def key_value(
        self, bucket: str, *, ttl: float | None = None, replicas: int = 1, grow_only: bool = False
    ) -> KeyValue:
        """The key-value bucket ``bucket`` (see ``bus.kv``), created if missing or updated to
        ``ttl`` (seconds a key lives after its last write; None: forever) and ``replicas``
        (copies in a JetStream cluster; ``grow_only``: an existing bucket keeps more, for a
        count taken from the servers one client sees, fewer while a cluster forms). Raises
        BusClosedError when the bus cannot keep it."""
        ...

    async def aclose(self) -> None:
        """Close the bus; subscriptions end and later calls raise BusClosedError."""
        ...
