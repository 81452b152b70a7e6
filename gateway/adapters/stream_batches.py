"""The read loop every translating adapter (Anthropic, Gemini, Bedrock) shares: each read of
the upstream's stream becomes one :class:`Batch` of canonical chunks, until the translator has
seen the end of the answer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

from gateway.adapters.base import JSON, Batch
from schemas import UpstreamError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable

Event = TypeVar("Event")


class CompletingTranslator(Protocol):
    """A stream translator that knows when the upstream's answer has ended."""

    @property
    def is_complete(self) -> bool: ...


async def translated_batches(
    reads: AsyncIterator[bytes],
    events: Callable[[bytes], Iterable[Event]],
    translate: Callable[[Event], list[JSON]],
    translator: CompletingTranslator,
) -> AsyncIterator[Batch]:
    """The canonical chunks of each read of ``reads`` (split into events by ``events``, each
    translated by ``translate``) as one Batch, the one that ends the answer marked ``last``.

    Returns once the translator is complete, or when ``reads`` end (the caller tells a
    truncated stream from a finished one by ``translator.is_complete``). An UpstreamError
    from ``events`` or ``translate`` is raised after the chunks before it were yielded: they
    still reach the client."""
    async for raw in reads:
        batch: list[JSON] = []
        failure: UpstreamError | None = None
        try:
            for event in events(raw):
                batch.extend(translate(event))
                if translator.is_complete:
                    break
        except UpstreamError as exc:
            failure = exc
        if batch:
            yield Batch(batch, last=translator.is_complete)
        if failure is not None:
            raise failure
        if translator.is_complete:
            return
