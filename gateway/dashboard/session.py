"""Dashboard sessions as signed, expiring tokens: no session table anywhere.

A session is the cookie value ``<payload>.<mac>``: ``payload`` is base64url JSON
``{"k": key id, "h": key fingerprint, "e": expiry (epoch s), "n": nonce}`` and ``mac`` its
HMAC-SHA256 under the deployment's dashboard secret. The fingerprint names the admin key the
session was signed in with, never the key: a gateway API key's sha256 (what the key store and
the ingress's key cache are indexed by), or for the bootstrap ``admin_key`` an HMAC of it (an
operator-chosen key may be guessable from a plain hash). Each request checks that key is still
valid, so revoking it ends its sessions at once. Any ingress with the same secret accepts a
token until it expires, so sessions need no owner and survive an ingress restart. (The
alternative, a session actor, would cost a bus round trip per dashboard request and give a
crash of that actor the power to sign every operator out.) The CSRF token is derived from the
nonce, so it is tied to the session and needs no storage either.

Sign-out drops the cookie and remembers the nonce (the session id) as ended in
:class:`EndedSessions`, a bounded set of ended nonces kept until their tokens expire; the
dashboard announces the nonce on the bus so every ingress ends it too.

The sign-in form is protected by a double-submit token: the sign-in page sets a random
``SameSite=Strict`` cookie (:data:`SIGNIN_COOKIE`) and puts its HMAC in the form
(:meth:`SessionSigner.signin_csrf`); a sign-in without both, matching, is refused, so no other
site can sign a browser in with the attacker's key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)

COOKIE = "llmgw_dashboard"
SIGNIN_COOKIE = "llmgw_signin"
BOOTSTRAP = "bootstrap:"  # the fingerprint prefix of a session of the bootstrap admin_key
_MAX_ENDED = 10_000


@dataclass(frozen=True, slots=True)
class Session:
    """A valid session: the admin key it was signed in with (id and fingerprint, see the
    module docstring), its expiry and its nonce (the session id)."""

    key_id: str
    key_hash: str
    expires: float
    nonce: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def deployment_secret(config: GatewayConfig) -> bytes:
    """``dashboard.secret``; else derived from the bootstrap admin key; else random (this
    process only, and said so)."""
    if config.dashboard.secret:
        return config.dashboard.secret.encode()
    if config.admin_key:
        # Derived, never the key itself: a leaked session secret must not be an admin key.
        return hashlib.sha256(b"llmgw-dashboard-session\0" + config.admin_key.encode()).digest()
    logger.warning(
        "dashboard: no dashboard.secret and no admin_key: sessions are signed with "
        "a random per-process secret (they end on restart and hold on this "
        "ingress only)"
    )
    return secrets.token_bytes(32)


class EndedSessions:
    """Nonces of sessions signed out on this ingress, kept until their tokens expire."""

    def __init__(self) -> None:
        self._ended: dict[str, float] = {}

    def end(self, nonce: str, expires: float, now: float) -> None:
        """Refuse the session ``nonce`` (whose token expires at ``expires``) from now on."""
        if expires <= now or nonce in self._ended:
            return  # over anyway, or known already
        if len(self._ended) >= _MAX_ENDED:
            self._ended = {n: e for n, e in self._ended.items() if e > now}
            if len(self._ended) >= _MAX_ENDED:  # all still live: the oldest goes first
                self._ended.pop(next(iter(self._ended)))
        self._ended[nonce] = expires

    def __len__(self) -> int:
        return len(self._ended)

    def __contains__(self, nonce: str) -> bool:
        return nonce in self._ended


class SessionSigner:
    """Issues and checks session tokens and their CSRF tokens under one secret."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self.ended = EndedSessions()

    def _mac(self, purpose: bytes, data: bytes) -> bytes:
        return hmac.new(self._secret, purpose + b"\0" + data, hashlib.sha256).digest()

    def bootstrap_fingerprint(self, admin_key: str) -> str:
        """The fingerprint a session of the bootstrap ``admin_key`` carries."""
        return BOOTSTRAP + _b64(self._mac(b"bootstrap", admin_key.encode()))[:22]

    def issue(self, key_id: str, key_hash: str, now: float, lifetime: float) -> tuple[str, Session]:
        """A new session's cookie value and the session."""
        session = Session(
            key_id=key_id,
            key_hash=key_hash,
            expires=now + lifetime,
            nonce=secrets.token_urlsafe(16),
        )
        payload = msgspec.json.encode(
            {"k": session.key_id, "h": session.key_hash, "e": session.expires, "n": session.nonce}
        )
        return f"{_b64(payload)}.{_b64(self._mac(b'session', payload))}", session

    def verify(self, token: str, now: float) -> Session | None:
        """The session of a cookie value; None when forged, malformed, expired or ended."""
        head, _, mac = token.partition(".")
        try:
            payload = _unb64(head)
            if not hmac.compare_digest(_unb64(mac), self._mac(b"session", payload)):
                return None
            fields = msgspec.json.decode(payload)
            session = Session(
                key_id=str(fields["k"]),
                key_hash=str(fields["h"]),
                expires=float(fields["e"]),
                nonce=str(fields["n"]),
            )
        except (ValueError, KeyError, TypeError, msgspec.DecodeError):
            return None
        if session.expires <= now or session.nonce in self.ended:
            return None
        return session

    def csrf(self, session: Session) -> str:
        """The CSRF token every state-changing call of ``session`` must carry."""
        return _b64(self._mac(b"csrf", session.nonce.encode()))

    def csrf_ok(self, session: Session, presented: str | None) -> bool:
        """Whether ``presented`` is ``session``'s CSRF token."""
        return presented is not None and _same(presented, self.csrf(session))

    def signin_csrf(self, cookie: str) -> str:
        """The sign-in form's token for the pre-session cookie value ``cookie``."""
        return _b64(self._mac(b"signin", cookie.encode()))

    def signin_ok(self, cookie: str | None, presented: str | None) -> bool:
        """Whether a sign-in carries the pre-session cookie and its form token."""
        return (
            bool(cookie)
            and presented is not None
            and _same(presented, self.signin_csrf(cookie or ""))
        )


def _same(presented: str, expected: str) -> bool:
    """``presented`` (the client's) equals ``expected``, compared in constant time as bytes:
    ``hmac.compare_digest`` refuses text that is not ASCII, and a client chooses this text."""
    return hmac.compare_digest(
        presented.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )
