"""A stream's unit of relay: the canonical chunks one upstream read carried
(``adapters.base`` re-exports it for the adapters and the ingress)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.text_chunk import Chunk

if TYPE_CHECKING:
    from collections.abc import Iterable

    from schemas.routing import RateReport


class Batch(list[Chunk]):
    """Canonical chunks one upstream read carried, in order (never empty): dicts, or
    ``TextChunk``s (``schemas.text_chunk``) where an upstream's chunk was one.

    ``last`` is True when the stream's terminator came with them: nothing follows, so the
    relay ends the client's answer in the same write. ``spent_for`` (the first batch only):
    the provider's ``x-ratelimit-remaining-*`` said a limit is spent, for this many seconds
    (:func:`rate_limit_spent_seconds`). ``rate`` (the first batch only): the request rate
    limit's state the answer's headers reported, and its token limit's (:func:`rate_report`).
    """

    __slots__ = ("last", "rate", "spent_for")

    def __init__(
        self,
        chunks: Iterable[Chunk],
        *,
        last: bool = False,
        spent_for: float | None = None,
        rate: RateReport | None = None,
    ) -> None:
        super().__init__(chunks)
        self.last = last
        self.spent_for = spent_for
        self.rate = rate
