"""A value that validates against a JSON schema, for the ``echo`` demo upstream.

The echo upstream answers ``response_format: json_schema`` and tool calls with made-up JSON,
so the SDKs' structured-output helpers work against the quick start. This covers what SDK
helpers generate (pydantic and zod schemas): objects (every property, so ``required`` and
``additionalProperties: false`` both hold), strings (common ``format``s, length bounds),
numbers and integers (bounds), booleans, null, arrays (item counts, ``prefixItems``), ``enum``,
``const``, ``anyOf``/``oneOf``/``allOf`` and local ``$ref``s. ``pattern`` is not honoured, nor
are counts and lengths past what one value may hold (``_MAX_UNITS``: items, members and
characters in all; a client's ``minItems: 30000000`` held the process for seconds), nor
bounds a float cannot reach (``multipleOf: 1e-320``, a 400-digit ``minimum``).
"""

from __future__ import annotations

import math
from typing import Any

JSON = dict[str, Any]

_MAX_DEPTH = 16  # recursive schemas (a tree of nodes) stop growing here
_MAX_UNITS = 100_000  # the items, members and string characters one value holds at most
_LARGEST_BOUND = 1e300  # a number bound past this is not honoured
_FORMATS = {
    "date-time": "1970-01-01T00:00:00Z",
    "date": "1970-01-01",
    "time": "00:00:00",
    "email": "echo@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "hostname": "example.com",
}


def example(schema: Any, text: str) -> Any:
    """A value valid under ``schema`` (anything goes for a schema that is not an object);
    strings carry ``text`` where no constraint says otherwise."""
    return _Builder(schema, text).value(schema, 0)


class _Builder:
    """Builds one value; holds the root schema (for ``$ref``) and the string to echo."""

    def __init__(self, root: Any, text: str) -> None:
        self._root = root if isinstance(root, dict) else {}
        self._text = text
        self._expanding: list[str] = []  # the $refs being built, outermost first
        self._left = _MAX_UNITS  # the items and characters it may still add

    def value(self, schema: Any, depth: int) -> Any:
        if not isinstance(schema, dict):
            return self._text  # `true` or a malformed schema: any value is valid
        ref = schema.get("$ref")
        if not isinstance(ref, str):
            return self._value(self._resolve(schema), depth)
        self._expanding.append(ref)
        try:
            return self._value(self._resolve(schema), depth)
        finally:
            self._expanding.pop()

    def _recursive(self, schema: Any) -> bool:
        """Whether ``schema`` refers back to a definition being built (a tree's node)."""
        return isinstance(schema, dict) and schema.get("$ref") in self._expanding

    def _value(self, schema: JSON, depth: int) -> Any:
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return schema["enum"][0]
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                return self.value(self._pick(options), depth)
        kind = _type_of(schema)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "string":
            return self._string(schema)
        if kind in ("number", "integer"):
            return _number(schema, integer=kind == "integer")
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return self._text

    def _resolve(self, schema: JSON, depth: int = 0) -> JSON:
        """``schema`` with local ``$ref``s followed and ``allOf`` parts merged (``depth``: the
        ``allOf`` parts it is within; one that refers back to itself stops growing there)."""
        for _ in range(_MAX_DEPTH):
            ref = schema.get("$ref")
            if not isinstance(ref, str):
                break
            target = self._lookup(ref)
            schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        parts = schema.get("allOf")
        if isinstance(parts, list):
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for part in parts if depth < _MAX_DEPTH else ():
                if isinstance(part, dict):
                    merged = {**self._resolve(part, depth + 1), **merged}
            schema = merged
        return schema

    def _lookup(self, ref: str) -> JSON:
        """The node a local JSON pointer (``#/$defs/Item``) names; {} when there is none."""
        if not ref.startswith("#"):
            return {}
        node: Any = self._root
        path = ref[1:].strip("/")
        for token in path.split("/") if path else ():
            key = token.replace("~1", "/").replace("~0", "~")
            node = node.get(key) if isinstance(node, dict) else None
        return node if isinstance(node, dict) else {}

    def _pick(self, options: list[Any]) -> Any:
        """The option to build: a concrete one, else null, else one that recurses."""
        null = [o for o in options if isinstance(o, dict) and o.get("type") == "null"]
        concrete = [o for o in options if o not in null and not self._recursive(o)]
        return (concrete or null or options)[0]

    def _object(self, schema: JSON, depth: int) -> JSON:
        if depth >= _MAX_DEPTH:
            return {}
        props = schema.get("properties")
        if not isinstance(props, dict) or self._left <= 0:
            return {}
        self._left -= len(props)
        return {name: self.value(sub, depth + 1) for name, sub in props.items()}

    def _array(self, schema: JSON, depth: int) -> list[Any]:
        prefix, items = schema.get("prefixItems"), schema.get("items", True)
        if isinstance(items, list):  # the draft-4 tuple form
            prefix, items = items, schema.get("additionalItems", True)
        prefix = prefix if isinstance(prefix, list) else []
        low = _int(schema.get("minItems"), 0)
        # One item is a plausible list, but a tree's list of nodes stays as short as it may.
        deep = depth >= _MAX_DEPTH or (self._recursive(items) and not prefix)
        count = low if deep else max(low, len(prefix), 1)
        if items is False:
            count = min(count, len(prefix))
        high = schema.get("maxItems")
        if isinstance(high, int):
            count = min(count, high)
        count = max(0, min(count, self._left))
        self._left -= count
        return [
            self.value(prefix[i] if i < len(prefix) else items, depth + 1) for i in range(count)
        ]

    def _string(self, schema: JSON) -> str:
        fmt = schema.get("format")
        out = _FORMATS.get(fmt, self._text) if isinstance(fmt, str) else self._text
        low = _int(schema.get("minLength"), 0)
        high = _int(schema.get("maxLength"), max(len(out), low))
        if len(out) < low:
            out += "." * max(0, min(low, self._left) - len(out))
        out = out[:high]
        self._left -= len(out)
        return out


def _type_of(schema: JSON) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if kinds else "null"
    if isinstance(kind, str):
        return kind
    if "properties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    return None


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _number(schema: JSON, *, integer: bool) -> int | float:
    """0 when the bounds allow it, else the value nearest 0 that they allow."""
    low, high = _bound(schema, "minimum"), _bound(schema, "maximum")
    xlow, xhigh = _bound(schema, "exclusiveMinimum"), _bound(schema, "exclusiveMaximum")
    value: float = 0
    if low is not None and value < low:
        value = math.ceil(low) if integer else low
    if xlow is not None and value <= xlow:
        upper = min((b for b in (high, xhigh) if b is not None), default=xlow + 2)
        value = math.floor(xlow) + 1 if integer else (xlow + upper) / 2
    if high is not None and value > high:
        value = math.floor(high) if integer else high
    if xhigh is not None and value >= xhigh:
        lower = max((b for b in (low, xlow) if b is not None), default=xhigh - 2)
        value = math.ceil(xhigh) - 1 if integer else (lower + xhigh) / 2
    step = schema.get("multipleOf")
    if isinstance(step, int | float) and step > 0 and value % step:
        steps = value / step
        value = math.ceil(steps) * step if math.isfinite(steps) else value
    if not math.isfinite(value):  # bounds near the float's own: none reachable
        value = 0
    return int(value) if integer else value


def _bound(schema: JSON, key: str) -> float | None:
    value = schema.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    # Past 1e300 (an integer of 400 digits, infinity) no float arithmetic reaches it.
    return value if -_LARGEST_BOUND < value < _LARGEST_BOUND else None
