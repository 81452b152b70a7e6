"""Who asks and with what labels: the caller's affinity key and conversation, and the labels
a client declares for the routing rules.

**Labels**: the ``x-llmgw-metadata`` request header, read by routing rules.

A client may declare labels for the routing rules' ``metadata.*`` namespace as one JSON
object of string, number or boolean values, at most :data:`MAX_BYTES` long, with at most
:data:`MAX_KEYS` keys and each string at most ``MAX_LABEL_BYTES`` of UTF-8: the longest text
the rule set's matching budget is computed for (``schemas.rule_cost``). Labels are untrusted:
the worst a forged one can do is select another chain the caller's own organisation may use.

**Affinity**: who is calling, the spec's ``derive_affinity_key``, first match wins.

1. an authenticated caller: ``key:<hash of its API key>``;
2. a caller presenting an inference grant (``X-Inference-Grant``): ``grant:<id>``;
3. an anonymous caller: ``ip:<address>``, IPv6 folded to its /64 so rotating privacy
   addresses stay on one backend. ``X-Forwarded-For`` is believed only when
   ``TRUST_PROXY_HEADERS=1`` (``routing.trust_proxy_headers``).

The key travels in every RouteRequest, is an affinity table's key in the model's actor and
reaches the request log (hashed), so what a client chose of it is cut to a bound: a grant to
:data:`MAX_GRANT_CHARS`, an address to :data:`MAX_ADDRESS_CHARS`.

A steered request's pin is kept per caller *and* conversation (:func:`conversation_key`):
the client's ``prompt_cache_key`` when it sends one, else the conversation's opening (its
system messages and first user message), which every later turn repeats and which a
provider's prompt cache is warm on.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from typing import TYPE_CHECKING, Any, NoReturn

import msgspec

from schemas import InvalidRequestError
from schemas.rules import MAX_LABEL_BYTES

if TYPE_CHECKING:
    from gateway.http.request import HttpRequest

HEADER = "x-llmgw-metadata"
MAX_BYTES = 4096
MAX_KEYS = 32
Labels = dict[str, str | int | float | bool]
_NONE: Labels = {}
# Typed, so a nested value is refused where it starts: an untyped decode recurses into it,
# and a JSON array 1,500 deep fits in MAX_BYTES and raises RecursionError.
_decode = msgspec.json.Decoder(Labels).decode


def client_metadata(req: HttpRequest) -> Labels:
    """The labels ``req`` declares ({} without the header; never to be mutated). Raises
    InvalidRequestError (param ``x-llmgw-metadata``) for a header that is not a JSON object
    of string, number or boolean values within the bounds."""
    raw = req.headers.get(HEADER)
    return _NONE if raw is None else parse_metadata(raw)


def parse_metadata(raw: str) -> Labels:
    """The labels of one header value. Raises InvalidRequestError as :func:`client_metadata`."""
    # The ASGI server hands header bytes over as latin-1; the JSON text is UTF-8.
    data = raw.encode("latin-1")
    if len(data) > MAX_BYTES:
        _refuse(f"at most {MAX_BYTES} bytes (got {len(data)})")
    try:
        value = _decode(data)
    except msgspec.ValidationError:
        if not data.lstrip().startswith(b"{"):
            _refuse("must be a JSON object of labels")
        _refuse("label values must be strings, numbers or booleans")
    except msgspec.DecodeError:
        _refuse("not valid JSON")
    if len(value) > MAX_KEYS:
        _refuse(f"at most {MAX_KEYS} labels (got {len(value)})")
    if "" in value:
        _refuse("a label name must not be empty")
    for key, label in value.items():
        if isinstance(label, str) and len(label.encode()) > MAX_LABEL_BYTES:
            _refuse(f"label {key!r} is longer than {MAX_LABEL_BYTES} bytes (UTF-8)")
    return value


def _refuse(problem: str) -> NoReturn:
    raise InvalidRequestError(f"the {HEADER} header is invalid: {problem}", param=HEADER)


# ---------------------------------------------------------------------------- affinity

MAX_GRANT_CHARS = 128
MAX_ADDRESS_CHARS = 64  # an IPv6 address with a zone id fits; garbage is cut
# Two openings alike for this long share a cached prefix anyway; hashing more costs time.
_OPENING_BYTES = 16_384


@functools.lru_cache(maxsize=4096)
def fold_address(addr: str) -> str:
    """An IPv4 address as is; an IPv6 address as its /64 network. Cached: it runs for every
    anonymous request, and parsing an address is a measurable share of the hot path."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return addr
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def client_address(req: HttpRequest, *, trust_proxy_headers: bool) -> str:
    """The caller's address: the first X-Forwarded-For hop if trusted, else the peer."""
    if trust_proxy_headers:
        forwarded = req.headers.get("x-forwarded-for")
        if forwarded:
            first = forwarded.split(",", 1)[0].strip()
            if first:
                return first[:MAX_ADDRESS_CHARS]
    return req.client_host()


def affinity_key(req: HttpRequest, *, key_hash: str | None, trust_proxy_headers: bool) -> str:
    """The affinity key of this request (see the module docstring)."""
    if key_hash:
        return f"key:{key_hash}"
    grant = req.headers.get("x-inference-grant")
    if grant:
        return f"grant:{grant.strip()[:MAX_GRANT_CHARS]}"
    return f"ip:{fold_address(client_address(req, trust_proxy_headers=trust_proxy_headers))}"


def conversation_key(body: Any) -> str:
    """The conversation a canonical (chat-shaped) request continues, as a short digest; ""
    for a request with no messages (embeddings), which no prompt cache serves."""
    if not isinstance(body, dict):
        return ""
    declared = body.get("prompt_cache_key")
    if isinstance(declared, str) and declared:
        return "k:" + _digest(declared.encode())
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ""
    opening = []
    for message in messages:
        opening.append(message)
        if isinstance(message, dict) and message.get("role") == "user":
            break
    try:
        encoded = msgspec.json.encode(opening)
    except (TypeError, RecursionError, msgspec.EncodeError):
        return ""
    return "o:" + _digest(encoded[:_OPENING_BYTES])


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()
