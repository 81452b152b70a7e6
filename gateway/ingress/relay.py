"""The relay of a committed stream to its client: each upstream read's chunks rendered in the
client's shape and written at once, then the end (clean, or the dialect's error when the
upstream broke or the relay failed), and the attempt closed however it ended."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from gateway.ingress.failover import outcome_of, unexpected
from schemas import UpstreamError

if TYPE_CHECKING:
    from gateway.http.request import HttpRequest
    from gateway.ingress.stream_attempt import StreamAttempt
    from gateway.ingress.surfaces import StreamRenderer

logger = logging.getLogger(__name__)


async def relay(
    req: HttpRequest,
    headers: list[tuple[bytes, bytes]],
    renderer: StreamRenderer,
    stream: StreamAttempt,
) -> None:
    """Write ``stream``'s batches to ``req`` as ``renderer`` shapes them, under ``headers``,
    and end it: cleanly, or in the dialect's error when the upstream broke or the relay
    failed; ``stream`` is closed (observed) however it ends. Raises the cancellation, and a
    write's error (the client gone)."""
    outcome, failure = "success", None
    unsent = bytearray()  # rendered frames not yet written
    internal = False  # the relay itself failed (logged already)
    try:
        await req.start(200, headers)
        async for batch in stream.batches():
            # One write per upstream read (a client send costs far more than the frames),
            # and the last read's frames go out with the end of the answer.
            renderer.feed_all(batch, unsent)
            if unsent and not batch.last:
                await req.chunk(bytes(unsent))
                unsent.clear()
        tail = renderer.finish()
    except UpstreamError as err:
        outcome, failure = outcome_of(err), err  # an unusable answer: the request's
        logger.warning(
            "stream from %s broke after commit: %s", stream.candidate.endpoint, err.message
        )
        tail = renderer.error(f"upstream stream broke: {err.message}", status=err.status)
    except anyio.get_cancelled_exc_class():
        await stream.close("cancelled")
        raise
    except Exception as exc:  # a gateway bug (what a shape cannot express is an UpstreamError)
        # The answer has begun: a torn connection would read as the network's fault, so
        # it ends in the dialect's error like a broken upstream (logged once, here); the
        # route is not charged with the gateway's own fault.
        endpoint = stream.candidate.endpoint
        logger.exception("internal error relaying the stream from %s", endpoint)
        internal = True
        outcome, failure = unexpected(endpoint, exc)
        try:
            tail = renderer.error("internal gateway error")
        except BaseException:
            await stream.close(outcome, failure)
            raise
    try:
        await req.chunk(b"".join([unsent, *tail]), more=False)
    except Exception:
        if not internal:
            raise
        # The end cannot be written either (what failed was a write): nothing more to do.
    finally:
        await stream.close(outcome, failure)
