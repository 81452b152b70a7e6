"""Redaction at the adapter seam: an upstream's error with the attempt's credential and every
``Bearer`` token replaced by ``[redacted]``, and its message clipped last. Re-exported by
``gateway.adapters.base``, whose ``RedactingAdapter`` applies it to every failed attempt."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gateway.adapters import upstream_status

if TYPE_CHECKING:
    from schemas import UpstreamError

__all__ = ["REDACTED", "redact", "redact_bytes", "redacted", "sealed"]

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


def sealed(err: UpstreamError, secret: str | None) -> UpstreamError:
    """:func:`redacted`, then its message clipped (``upstream_status.clipped``): the seam's
    last step, after an adapter redacted its own secrets (a secret cut in two by an earlier
    clip would no longer be found)."""
    redacted(err, secret)
    message = upstream_status.clipped(err.message)
    if message != err.message:
        err.message = message
        err.args = (message,)
    return err
