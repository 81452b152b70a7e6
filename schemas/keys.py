"""Callers and credentials on the bus: roles, key-pool state, provider-key declarations.

Roles rank ``free < pro < internal < admin``; ``None`` is a caller with no user identity
(internal traffic), which reservation never restricts. Credentials travel only as their short
hash id (``schemas.config.credential_id``); a gateway API key only as its sha256 hex.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import msgspec

ROLES: tuple[str, ...] = ("free", "pro", "internal", "admin")
_RANK = {name: i for i, name in enumerate(ROLES)}
UNRESTRICTED = len(ROLES)


def role_rank(role: str | None) -> int:
    """The rank of ``role``; ``None`` (no user identity) outranks every role.

    Raises ValueError for a name that is not a role.
    """
    if role is None:
        return UNRESTRICTED
    try:
        return _RANK[role]
    except KeyError:
        raise ValueError(f"unknown role {role!r} (roles: {', '.join(ROLES)})") from None


def hash_key(key: str) -> str:
    """The only form of a gateway API key that is stored or sent anywhere (sha256 hex)."""
    return hashlib.sha256(key.encode()).hexdigest()


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# Every time or duration an argument names lies in what a datetime can show (years 1 to 9999):
# NaN, infinities and the like would otherwise reach a store's int() or an SQLite INTEGER.
MIN_INSTANT_S = -62_135_596_800.0  # 0001-01-01T00:00:00Z
MAX_INSTANT_S = 253_402_300_799.0  # 9999-12-31T23:59:59Z
MAX_DURATION_S = MAX_INSTANT_S


def parse_duration(value: str | float) -> float:
    """Seconds from ``90``, ``"90s"``, ``"15m"``, ``"12h"`` or ``"30d"``: positive and at most
    :data:`MAX_DURATION_S`. Raises ValueError."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = _as_float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip().lower()
        unit = _UNITS.get(text[-1])
        try:
            seconds = float(text[:-1]) * unit if unit else float(text)
        except ValueError:
            raise ValueError(
                f"not a duration: {shown(value)} (e.g. 3600, 90m, 12h, 30d; "
                "a key without one never expires)"
            ) from None
    else:
        raise ValueError(f"not a duration: {shown(value)}")
    if not seconds > 0:  # NaN too
        raise ValueError("a duration must be positive")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"a duration must be at most {MAX_DURATION_S:.0f} seconds")
    return seconds


def parse_instant(value: str | float) -> float:
    """Unix seconds from a number or an ISO 8601 time (UTC when no offset), between years 1
    and 9999. Raises ValueError."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _bounded_instant(_as_float(value))
    if not isinstance(value, str):
        raise ValueError(f"not a time: {shown(value)}")
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:  # its message is Python's (a timedelta's repr for a bad offset)
        raise ValueError("not an ISO 8601 time (such as 2030-01-31T12:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return _bounded_instant(moment.timestamp())


def expiry_problem(expires: float | None, now: float) -> str | None:
    """Why a new key cannot expire at ``expires`` (Unix seconds; None: never), or None. A key
    made already expired is refused, not created unusable: its caller would get 401s."""
    if expires is None or expires > now:
        return None
    return "the key would be expired already: its expiry must be in the future"


def fits_int64(value: int) -> bool:
    """Whether ``value`` fits a signed 64-bit integer: an SQLite INTEGER, a PostgreSQL
    BIGINT, a msgpack or Go peer's int (larger ones overflow there)."""
    return -(2**63) <= value < 2**63


def shown(value: object, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters, for an error message (an integer of
    thousands of digits has no repr at all)."""
    if isinstance(value, int) and not -(10**limit) < value < 10**limit:
        return f"an integer of more than {limit} digits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _as_float(value: float) -> float:
    """``value`` as a float. Raises ValueError for an integer too large for one."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"out of range: {shown(value)}") from None


def _bounded_instant(seconds: float) -> float:
    """``seconds`` if it is a time between years 1 and 9999. Raises ValueError."""
    if not MIN_INSTANT_S <= seconds <= MAX_INSTANT_S:  # NaN too
        raise ValueError(f"not a time between the years 1 and 9999: {shown(seconds)}")
    return seconds


def parse_since(value: str | float, now: float) -> float:
    """Unix seconds from a time (epoch seconds, ISO 8601) or from a duration with its unit
    before ``now`` (``90s``, ``10m``, ``12h``, ``30d``), between years 1 and 9999. Raises
    ValueError (NaN, infinities and out-of-range numbers too)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text[-1:] in _UNITS and text[:-1].replace(".", "", 1).isdigit():
            return _bounded_instant(now - parse_duration(text))
        try:
            seconds = float(text)
        except ValueError:
            pass
        else:
            return _bounded_instant(seconds)  # its own error, not the generic one below
    try:
        return parse_instant(value)
    except ValueError:
        raise ValueError(
            f"not a time: {shown(value)} (epoch seconds, ISO 8601, or a duration ago: 10m, 2h, 30d)"
        ) from None


def most_restrictive(*roles: str | None) -> str:
    """The highest of ``roles`` (``free`` when none is given): a laxer duplicate never widens."""
    named = [r for r in roles if r is not None]
    return max(named, key=role_rank) if named else ROLES[0]


class PoolKey(msgspec.Struct, frozen=True, kw_only=True):
    """One declared key of a pool, as views see it (never the secret)."""

    credential_id: str
    min_role: str = "free"
    muted_until: float | None = None
    source: str = "config"


class KeyPoolState(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A KeyPoolActor's declaration and mutes, published on every change.

    ``epoch`` changes when the actor restarts, so a view accepts a restarted owner's lower
    ``seq``; ``declarations`` is the ``seq`` of the last KeyDeclarations folded in.
    """

    pool: str
    keys: tuple[PoolKey, ...] = ()
    epoch: str = ""
    seq: int = 0
    declarations: int = 0
    # Credentials cooling after a provider's 429 (back-pressure, not a mute): id -> when it
    # ends ("" is a route without keys).
    cooling: dict[str, float] = {}


class KeyPoolStateRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask a KeyPoolActor for its current KeyPoolState."""


class KeyAcquire(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask a KeyPoolActor directly for a credential (outside a ModelActor's plan)."""

    caller: str = ""
    role: str | None = None


class KeyGrant(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Answer to KeyAcquire: the credential id to spend (``""``: the pool holds no key)."""

    pool: str
    credential_id: str


class ProviderKeyDecl(msgspec.Struct, frozen=True, kw_only=True):
    """A database-added provider key, without its secret: which pools it joins, its tier."""

    key_id: str
    credential_id: str
    endpoint: str = ""
    base_url: str = ""
    min_role: str = "free"
    created: float = 0.0


class KeyDeclarations(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Provider-key declarations beyond each route's own (the key registry's state).

    ``reservations`` maps a credential id to the most restrictive ``min_role`` declared for it
    by hash (environment reservations) or anywhere in the config; ``db_keys`` are the
    database-added keys in creation order.
    """

    db_keys: tuple[ProviderKeyDecl, ...] = ()
    reservations: dict[str, str] = {}
    seq: int = 0


class KeyDeclarationsRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask the key registry for its current KeyDeclarations."""


class ApiKeyCreated(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A gateway API key was created (auth is on from now); ``key_hash`` is its sha256 hex."""

    key_hash: str


class ApiKeyRevoked(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A gateway API key was revoked: every ingress drops it from its cache at once."""

    key_hash: str


class DashboardSessionEnded(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A dashboard session was signed out: every ingress refuses it from now on.

    ``session`` is the session's id (its nonce), never its token; ``expires`` is when the token
    runs out anyway (epoch s), so the ingresses forget the id then.
    """

    session: str
    expires: float


class KeyMuted(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A pool took a key out of rotation after a key-specific failure (operator event)."""

    pool: str
    credential_id: str
    until: float
    seconds: float
    status: int | None = None
    reason: str = ""


class KeyCooling(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A provider answered a credential with a rate limit (429): the pool rests it on that
    route until ``until`` (operator event). ``hinted``: the provider said how long
    (``Retry-After``, ``x-ratelimit-reset-*``); else the adaptive backoff chose ``seconds``.
    ``credential_id`` is ``""`` for a route without keys."""

    pool: str
    credential_id: str
    until: float
    seconds: float
    hinted: bool = False
    ts: float = 0.0


class KeyUnmuted(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A muted key's time ran out; it is back in rotation (operator event)."""

    pool: str
    credential_id: str


class ApiKeyLookup(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask the owner of the gateway API keys about one key, by its sha256 hex, or by its id
    (``gk-...``) when ``key_id`` is set (the limits' owner checks a key exists)."""

    key_hash: str
    key_id: str = ""


class ApiKeyInfo(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The owner's answer to ApiKeyLookup: who a key belongs to and whether it still holds.

    ``found`` False: no such key (the other fields are empty). Never the key, never a secret.
    """

    found: bool
    key_id: str = ""
    role: str = "free"
    org: str = ""
    user: str = ""
    expires: float | None = None
    revoked: float | None = None

    def status(self, now: float) -> str:
        """``unknown``, ``revoked``, ``expired`` or ``active`` at unix time ``now``."""
        if not self.found:
            return "unknown"
        if self.revoked is not None:
            return "revoked"
        if self.expires is not None and self.expires <= now:
            return "expired"
        return "active"


class AuthStateRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask the owner of the gateway API keys for its AuthState."""


class AuthState(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Whether any gateway API key exists (revoked ones count): auth is on once one does."""

    any_keys: bool


class ProviderSecretRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """An ingress asks the key registry for the secret of one database-added credential."""

    credential_id: str


class ProviderSecretGrant(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The secret of one database-added credential, for ``ttl_seconds`` (then ask again).

    Sent only as the reply to ProviderSecretRequest, on the asker's inbox; never logged.
    """

    credential_id: str
    secret: str
    ttl_seconds: float

    def __repr__(self) -> str:
        return f"ProviderSecretGrant(credential_id={self.credential_id!r}, secret='[secret]')"
