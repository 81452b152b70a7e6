"""Asking the gateway API keys' owner (ApiKeyAdminActor, on ``llmgw.auth.keys.lookup``)
whether a key id exists, for an owner that keeps something per key (a limit) and refuses a
key that does not exist. Holds no state, so an actor can ask off its mailbox."""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

from schemas import (
    ApiKeyInfo,
    ApiKeyLookup,
    BusTimeoutError,
    NoRespondersError,
    RouteNotFoundError,
    raise_for_reply,
    subjects,
)

if TYPE_CHECKING:
    from actors.admin import AdminQuestion
    from bus import Bus

logger = logging.getLogger(__name__)

_KEY_CHECK_TIMEOUT_S = 2.0


def key_question(bus: Bus, subject: str) -> AdminQuestion | None:
    """The question whether the key of a ``key:<id>`` subject exists (see
    :func:`check_key`), None for a subject that is not a key."""
    if not subject.startswith("key:"):
        return None
    return partial(check_key, bus, subject[len("key:") :])


async def check_key(bus: Bus, key_id: str) -> None:
    """Refuse a key its owner does not know (a limit on a typo would limit nothing).
    Raises RouteNotFoundError. A key owner that cannot be asked (not running, e.g. a lone
    LimitsActor) lets it through: it can only ever concern that id."""
    try:
        reply = await bus.request(
            subjects.AUTH_KEYS_LOOKUP,
            ApiKeyLookup(key_hash="", key_id=key_id),
            reply_type=ApiKeyInfo,
            timeout=_KEY_CHECK_TIMEOUT_S,
        )
    except (NoRespondersError, BusTimeoutError) as exc:
        logger.warning("key %s not checked: its owner did not answer (%s)", key_id, exc.message)
        return
    info = raise_for_reply(reply)
    if not info.found:
        raise RouteNotFoundError(f"no gateway API key {key_id!r} (`llmgw keys list` shows the ids)")
