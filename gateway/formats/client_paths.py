"""A refusal in the client's own terms: the canonical chat path an error names, written as the
field of the request the client sent.

A Responses or Messages request is translated to the canonical chat shape, and what refuses
it later (an upstream's translation, a check on the canonical body) names chat's fields:
``messages[2].tool_calls[0].function.arguments`` for what the client sent as
``input[3].arguments``. The translations record, when asked, where each canonical part came
from (:data:`Origins`); only a refused request asks, by translating its body again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schemas import GatewayError

__all__ = ["Origins", "in_client_terms"]

Origins = dict[str, str]
"""Canonical path -> the client's path it came from; a path under a key is under its value."""


def in_client_terms(err: GatewayError, origins: Origins) -> None:
    """Write the canonical path ``err`` names, in its ``param`` and at the head of its
    message, as the client's (in place: the error keeps its class, status and code)."""
    param = getattr(err, "param", None)
    if isinstance(param, str):
        err.param = _client_path(param, origins)  # type: ignore[attr-defined]
    head, sep, rest = err.message.partition(": ")
    if sep and " " not in head:  # "messages[1].content: must be ..."
        err.message = _client_path(head, origins) + sep + rest
        err.args = (err.message,)


def _client_path(path: str, origins: Origins) -> str:
    best = ""
    for key in origins:  # a scan: it runs for a refused request only
        if len(key) > len(best) and path.startswith(key):
            if len(path) == len(key) or path[len(key)] in ".[":
                best = key
    return origins[best] + path[len(best) :] if best else path
