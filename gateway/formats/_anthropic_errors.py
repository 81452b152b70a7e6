"""Anthropic's error shape on the Messages surface: the ``error.type`` for an HTTP status,
and the body ``{"type": "error", "error": {"type", "message"}}``."""

from __future__ import annotations

from typing import Any

__all__ = ["KNOWN_ERROR_TYPES", "error_body", "error_type"]

_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
KNOWN_ERROR_TYPES = frozenset(_ERROR_TYPES.values()) | {"api_error"}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error shape, its ``error.type`` chosen by HTTP ``status``."""
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def error_type(status: int) -> str:
    """Anthropic's ``error.type`` for an HTTP status."""
    known = _ERROR_TYPES.get(status)
    if known is not None:
        return known
    return "api_error" if status >= 500 else "invalid_request_error"
