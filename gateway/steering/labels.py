"""Client labels: the ``x-llmgw-metadata`` request header, read by routing rules.

A client may declare labels for the routing rules' ``metadata.*`` namespace as one JSON
object of string, number or boolean values, at most :data:`MAX_BYTES` long, with at most
:data:`MAX_KEYS` keys and each string at most ``MAX_LABEL_BYTES`` of UTF-8: the longest text
the rule set's matching budget is computed for (``schemas.rule_cost``). Labels are untrusted:
the worst a forged one can do is select another chain the caller's own organisation may use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

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
    raw = req.header(HEADER)
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
