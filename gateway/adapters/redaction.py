"""Keeping credentials out of what an upstream says: the one place its text is redacted.

Some upstreams echo the credential they were sent (``Incorrect API key: sk-…``, ``stream
aborted for key Bearer sk-…``) in an error body, an in-band stream error or a 401. Every
adapter ``make_adapters`` hands out is a :class:`RedactingAdapter`, so each ``UpstreamError``
leaves the adapter seam with the attempt's key (and any ``Bearer`` token) replaced by
``[redacted]``, before anything can answer, log, observe or publish it: plain answers,
a stream broken mid-answer, hedged twins and both background probers alike.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from schemas import UpstreamError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from gateway.adapters.base import JSON, Adapter, Batch, UpstreamTarget

REDACTED = "[redacted]"
# A bearer token the upstream repeats need not be this attempt's key (a proxy in front of
# it may hold its own): whatever follows ``Bearer`` is a credential.
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s\"',;]+")
_BEARER_BYTES = re.compile(rb"(?i)(bearer\s+)[^\s\"',;]+")


def redact(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` and every ``Bearer`` token replaced by ``[redacted]``."""
    if secret:
        text = text.replace(secret, REDACTED)
    return _BEARER.sub(rf"\g<1>{REDACTED}", text)


def redact_bytes(body: bytes, secret: str | None) -> bytes:
    """:func:`redact` for a raw upstream body."""
    if secret:
        body = body.replace(secret.encode(), REDACTED.encode())
    return _BEARER_BYTES.sub(rb"\g<1>" + REDACTED.encode(), body)


def redacted(err: UpstreamError, secret: str | None) -> UpstreamError:
    """``err`` with its message and body redacted (in place, so its type is kept)."""
    message = redact(err.message, secret)
    if message != err.message:
        err.message = message
        err.args = (message,)
    if err.body:
        err.body = redact_bytes(err.body, secret)
    return err


class RedactingAdapter:
    """Wraps one adapter; every UpstreamError it raises leaves with the attempt's
    credential redacted (see the module docstring). Raises what the wrapped adapter raises."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Adapter) -> None:
        self._inner = inner

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        """The wrapped adapter's answer."""
        try:
            return await self._inner.complete(target, body)
        except UpstreamError as err:
            redacted(err, target.api_key)
            raise

    async def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        """The wrapped adapter's batches, up to the error that ends them, redacted."""
        batches = self._inner.stream(target, body)
        try:
            async for batch in batches:
                yield batch
        except UpstreamError as err:
            redacted(err, target.api_key)
            raise
        finally:
            aclose = getattr(batches, "aclose", None)
            if aclose is not None:  # closing this stream closes the upstream's at once
                await aclose()

    async def embed(self, target: UpstreamTarget, body: JSON) -> JSON:
        """The wrapped adapter's answer."""
        try:
            return await self._inner.embed(target, body)
        except UpstreamError as err:
            redacted(err, target.api_key)
            raise
