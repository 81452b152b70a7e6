"""The inbox prefix of a NATS connection: where the replies to its requests arrive."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

__all__ = ["INBOX_ROOT", "inbox_prefix_for"]

# Replies go to inboxes only: every inbox prefix is one token that starts with this.
INBOX_ROOT = "_INBOX"
_INBOX_PREFIX = re.compile(r"_INBOX[A-Za-z0-9_-]*")
_USER_TOKEN = re.compile(r"[A-Za-z0-9_-]+")


def inbox_prefix_for(url: str, explicit: str | None = None) -> str:
    """The inbox prefix a connection to ``url`` uses: ``explicit`` if given, else
    ``_INBOX_<user>`` for the user name in the (first) URL, else ``_INBOX`` (no user, or a
    token: ``nats://TOKEN@host``).

    A per-user prefix lets the NATS permissions give each user subscribe rights on its own
    inbox only (``_INBOX_<user>.>``), so no user can read the replies another asked for
    (a secret grant, a new gateway key). Raises ValueError for an explicit prefix that is not
    one subject token starting with ``_INBOX``, or a user name that is not one (set the
    prefix explicitly then).
    """
    if explicit is not None:
        if not _INBOX_PREFIX.fullmatch(explicit):
            raise ValueError(
                f"inbox prefix {explicit!r}: expected _INBOX followed by letters, "
                "digits, '_' or '-' (one subject token)"
            )
        return explicit
    parts = urlsplit(url.split(",", 1)[0].strip())
    user = parts.username
    if not user or parts.password is None:
        return INBOX_ROOT  # no user, or a token (nats://TOKEN@host): never put it in subjects
    user = unquote(user)
    if not _USER_TOKEN.fullmatch(user):
        raise ValueError(
            "the NATS user name cannot form an inbox prefix (letters, digits, "
            "'_' and '-' only): set bus.inbox_prefix"
        )
    return f"{INBOX_ROOT}_{user}"
