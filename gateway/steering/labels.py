"""Client labels: the ``x-llmgw-metadata`` request header, read by routing rules.

A client may declare labels for the routing rules' ``metadata.*`` namespace as one JSON
object of string, number or boolean values, at most :data:`MAX_BYTES` long and with at most
:data:`MAX_KEYS` keys. Labels are untrusted: the worst a forged one can do is select another
chain the caller's own organisation may use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import msgspec

from schemas import InvalidRequestError

if TYPE_CHECKING:
    from gateway.ingress.request import HttpRequest

HEADER = "x-llmgw-metadata"
MAX_BYTES = 4096
MAX_KEYS = 32
Labels = dict[str, str | int | float | bool]
_NONE: Labels = {}
_decode = msgspec.json.Decoder().decode


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
        value: Any = _decode(data)
    except msgspec.DecodeError:
        _refuse("not valid JSON")
    if not isinstance(value, dict):
        _refuse("must be a JSON object of labels")
    if len(value) > MAX_KEYS:
        _refuse(f"at most {MAX_KEYS} labels (got {len(value)})")
    for key, label in value.items():
        if not key:
            _refuse("a label name must not be empty")
        if not isinstance(label, str | int | float):  # bool is an int
            _refuse(f"label {key!r} must be a string, a number or a boolean")
    return value


def _refuse(problem: str) -> NoReturn:
    raise InvalidRequestError(f"the {HEADER} header is invalid: {problem}", param=HEADER)
