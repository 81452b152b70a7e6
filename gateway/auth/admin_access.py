"""Who is an admin: the bootstrap admin key (config ``admin_key`` or ``LLMGW_ADMIN_KEY``), or
a gateway API key of role ``admin`` (identified by ``gateway.auth.gate``'s gate, which stores the
caller in the request's scope under :data:`CALLER_SCOPE_KEY` before any handler runs).

One function so every admin surface asks the same question.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from schemas import ForbiddenError, UnauthorizedError

if TYPE_CHECKING:
    from gateway.http.request import HttpRequest
    from schemas.config import GatewayConfig

CALLER_SCOPE_KEY = "llmgw.caller"
# Who an admin command is audited as (``AdminCommand.by``), when not the plain HTTP API: the
# dashboard sets ``dashboard:<admin key id>`` for the request it forwards.
BY_SCOPE_KEY = "llmgw.by"
# A check ``() -> Awaitable[bool]`` a long answer (the event stream) makes before each frame:
# the dashboard's "is the session still on?", so a signed-out session gets no more events.
STILL_ALLOWED_SCOPE_KEY = "llmgw.still_allowed"


def requested_by(req: HttpRequest, default: str = "http") -> str:
    """The audit name of ``req``'s admin command: what :data:`BY_SCOPE_KEY` says, else
    ``default``."""
    by = req.scope.get(BY_SCOPE_KEY)
    return by if isinstance(by, str) and by else default


def is_admin(req: HttpRequest, config: GatewayConfig) -> bool:
    """True when the request presents the bootstrap admin key or an admin API key."""
    if getattr(req.scope.get(CALLER_SCOPE_KEY), "is_admin", False):
        return True
    admin = config.admin_key
    token = req.bearer_token()
    if not admin or not token:
        return False
    return hmac.compare_digest(token.encode(), admin.encode())


def require_admin(req: HttpRequest, config: GatewayConfig, message: str) -> None:
    """Return when :func:`is_admin`; else raise ForbiddenError with ``message`` for a caller
    the gate identified (a valid key of another role: its key is no answer), and
    UnauthorizedError for one it did not (no key, or one it does not know)."""
    if is_admin(req, config):
        return
    if req.scope.get(CALLER_SCOPE_KEY) is not None:
        raise ForbiddenError(message)
    raise UnauthorizedError(message)
