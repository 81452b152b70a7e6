"""Bus failures, as GatewayErrors so the ingress can answer them without translation."""

from __future__ import annotations

from schemas import BusTimeoutError, GatewayError
from schemas import NoRespondersError as _NoResponders


class NoRespondersError(_NoResponders):
    """A request found no subscriber on its subject."""


class RequestTimeoutError(BusTimeoutError):
    """A request got no reply within its timeout."""


class BusClosedError(GatewayError):
    """The bus was closed (or the connection lost for good) while in use."""
