"""What an operator may name things with, and how a refused name is shown back.

A name (a chain, a rule, a gateway key, an org) is echoed in lists, logs, events, terminals and
error messages; so none may hide or forge a line there, and an error quotes a long one clipped.
"""

from __future__ import annotations

import re

from schemas.errors import InvalidRequestError

# C0 and C1 controls, DEL, line and paragraph separators and the bidirectional overrides:
# none belongs in a name, and each can forge or hide a line in a log or a terminal.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
SHOWN_CHARS = 64
"""Characters of a refused name an error message quotes before eliding the rest."""


SECRET_MAX_CHARS = 8192
"""Longest upstream secret or URL an admin may give (a cloud token runs to a few KiB)."""


def has_unprintable(text: str) -> bool:
    """Whether ``text`` holds a control character, a line separator or a bidi override."""
    return _UNPRINTABLE.search(text) is not None


def shown(text: str) -> str:
    """``text`` quoted for an error message: its first SHOWN_CHARS characters, then how many
    more there were, so a 5,000-character name does not come back whole."""
    if len(text) <= SHOWN_CHARS:
        return repr(text)
    return f"{text[:SHOWN_CHARS]!r}... ({len(text)} characters)"


def checked_text(value: object, name: str, max_chars: int) -> str:
    """``value`` (argument ``name``) stripped, when it is a non-empty string of at most
    ``max_chars`` printable characters. Raises InvalidRequestError naming ``name``, never
    quoting the value (it may be a secret)."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequestError(f"'{name}' must be a non-empty string", param=name)
    text = value.strip()
    if len(text) > max_chars:
        raise InvalidRequestError(
            f"'{name}' must be at most {max_chars} characters (got {len(text)})", param=name
        )
    if has_unprintable(text):
        raise InvalidRequestError(
            f"'{name}' must not contain control characters or line separators", param=name
        )
    return text
