"""A compiled routing rule set and its evaluation per request: the match tree each rule
compiles to (comparisons, ``$and``, ``$or``), the first rule that matches, and explain's
trace of every rule. ``schemas.rule_language`` validates a set and builds these; nothing here
raises.

A comparison is a closure built once (``leaf_match``), so evaluating a rule is a dictionary
lookup and one test per clause. The semantics (MongoDB's where the issue is silent) are in
``schemas.rule_language``'s docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import re2

Values = Mapping[str, Any]
_MISSING = object()
# Fields whose value is a list: an operator holds when it holds for any element ($ne and
# $nin: for none).
_LIST_FIELDS = frozenset({"params.modalities"})
_SEQUENCES = (list, tuple)
_NO_MATCH = (-1, -1)  # the span RE2's binding reports when nothing matched
# RE2's Match(anchor, text, start, end): the spans of the first match and its groups.
_Run = Callable[[Any, bytes, int, int], list[tuple[int, int]]]


@dataclass(frozen=True, slots=True)
class Failed:
    """Why a rule did not match: the path of the first failing clause, its field's value."""

    path: str
    value: Any = None
    missing: bool = False


Match = Callable[[Values, Values], bool]  # (params, metadata) -> whether a condition holds


class Leaf:
    """One comparison of one field. ``match`` is a closure built once per leaf, so the hot
    path is a dictionary lookup and one test per clause."""

    __slots__ = ("field", "match", "path", "pattern")
    match: Match

    def __init__(self, path: str, field: str, match: Match, pattern: object = None) -> None:
        self.path = path
        self.field = field
        self.match = match
        self.pattern = pattern  # the compiled RE2 program of a $regex

    def failure(self, params: Values, metadata: Values) -> Failed | None:
        if self.match(params, metadata):
            return None
        namespace, key = self.field.split(".", 1)
        v = (params if namespace == "params" else metadata).get(key, _MISSING)
        return Failed(self.path, missing=True) if v is _MISSING else Failed(self.path, v)


class AllOf:
    __slots__ = ("children", "match", "path")
    match: Match

    def __init__(self, path: str, children: tuple[Node, ...]) -> None:
        self.path = path
        self.children = children
        self.match = _all_of(tuple(c.match for c in children))

    def failure(self, params: Values, metadata: Values) -> Failed | None:
        for c in self.children:
            failed = c.failure(params, metadata)
            if failed is not None:
                return failed
        return None


class AnyOf:
    __slots__ = ("children", "match", "path")
    match: Match

    def __init__(self, path: str, children: tuple[Node, ...]) -> None:
        self.path = path
        self.children = children
        self.match = _any_of(tuple(c.match for c in children))

    def failure(self, params: Values, metadata: Values) -> Failed | None:
        # No single clause is to blame when every alternative failed: name the $or.
        return None if self.match(params, metadata) else Failed(self.path)


Node = Leaf | AllOf | AnyOf


def _all_of(matches: tuple[Match, ...]) -> Match:
    if len(matches) == 1:
        return matches[0]

    def match(p: Values, m: Values) -> bool:
        for one in matches:
            if not one(p, m):
                return False
        return True

    return match


def _any_of(matches: tuple[Match, ...]) -> Match:
    if len(matches) == 1:
        return matches[0]

    def match(p: Values, m: Values) -> bool:
        for one in matches:
            if one(p, m):
                return True
        return False

    return match


class Comparison(NamedTuple):
    """One operator with its operand, as ``schemas.rule_language`` validated it: ``op`` is
    ``$eq`` (also for ``$ne``), ``$gt``, ``$gte``, ``$lt``, ``$lte``, ``$in`` (also for
    ``$nin``) or ``$regex``; ``operand`` the literal, for ``$in`` its values in one set per
    value type (so ``True`` never matches ``1`` and a test builds no key), for ``$regex`` the
    compiled RE2 program; ``types`` the value types the literal compares with."""

    op: str
    operand: Any
    types: frozenset[type] = frozenset()


def leaf_match(field: str, comparison: Comparison, negated: bool) -> Match:
    """The closure of one comparison: look ``field`` up and test it (any element of a
    list-valued field), negated for ``$ne``/``$nin``, which alone match a missing field."""
    namespace, key = field.split(".", 1)
    in_params = namespace == "params"
    if field in _LIST_FIELDS:
        return _list_match(in_params, key, element_test(comparison), negated)
    return _scalar_match(in_params, key, comparison, negated)


def element_test(comparison: Comparison) -> Callable[[Any], bool]:
    """The test of one present value (an element of a list field), not negated."""
    op, operand, types = comparison
    match op:
        case "$in":
            return lambda v: (values := operand.get(type(v))) is not None and v in values
        case "$regex":
            search = _searcher(operand)
            return lambda v: type(v) is str and search(v)
        case "$eq":
            return lambda v: type(v) in types and v == operand
        case "$gt":
            return lambda v: type(v) in types and v > operand
        case "$gte":
            return lambda v: type(v) in types and v >= operand
        case "$lt":
            return lambda v: type(v) in types and v < operand
    return lambda v: type(v) in types and v <= operand  # $lte


def _list_match(in_params: bool, key: str, test: Callable[[Any], bool], negated: bool) -> Match:
    def any_element(p: Values, m: Values) -> bool:
        v = (p if in_params else m).get(key, _MISSING)
        if v is _MISSING:
            return negated
        if isinstance(v, _SEQUENCES):
            # A loop, not any() over a generator: building the generator cost more than
            # testing the four elements a request may list.
            for x in v:
                if test(x):
                    return not negated
            return negated
        return test(v) is not negated

    return any_element


def _scalar_match(in_params: bool, key: str, comparison: Comparison, negated: bool) -> Match:
    # The lookup and the test in one closure, one per operator: a clause is one Python call
    # (a test called from the lookup was a second, about a quarter of the clause's time).
    # ``x is not negated`` is ``x`` or, for $ne/$nin, ``not x``; a missing field is the
    # sentinel, whose type no operand compares with, so only a negation matches it.
    op, operand, types = comparison
    match op:
        case "$in":

            def member(p: Values, m: Values) -> bool:
                v = (p if in_params else m).get(key, _MISSING)
                values = operand.get(type(v))
                return (values is not None and v in values) is not negated

            return member
        case "$regex":
            run, unanchored = _program(operand)

            def searched(p: Values, m: Values) -> bool:
                v = (p if in_params else m).get(key, _MISSING)
                if type(v) is not str:
                    return False
                text = v.encode()
                return run(unanchored, text, 0, len(text))[0] != _NO_MATCH

            return searched
        case "$eq":

            def equal(p: Values, m: Values) -> bool:
                v = (p if in_params else m).get(key, _MISSING)
                return (type(v) in types and v == operand) is not negated

            return equal
        case "$gt":

            def above(p: Values, m: Values) -> bool:
                v = (p if in_params else m).get(key, _MISSING)
                return type(v) in types and v > operand

            return above
        case "$gte":

            def at_least(p: Values, m: Values) -> bool:
                v = (p if in_params else m).get(key, _MISSING)
                return type(v) in types and v >= operand

            return at_least
        case "$lt":

            def below(p: Values, m: Values) -> bool:
                v = (p if in_params else m).get(key, _MISSING)
                return type(v) in types and v < operand

            return below

    def at_most(p: Values, m: Values) -> bool:
        v = (p if in_params else m).get(key, _MISSING)
        return type(v) in types and v <= operand

    return at_most


def _program(program: Any) -> tuple[_Run, Any]:
    """The RE2 object's ``Match`` and the unanchored mode of ``program`` (compiled with
    ``never_capture``): called with UTF-8 bytes, it answers the span of the first match,
    :data:`_NO_MATCH` when there is none.

    The binding's ``search`` wraps the same call in a generator and, for a string, maps byte
    offsets back to characters, which cost more than a small pattern's search itself.
    ``test_rule_language.py::test_the_direct_search_agrees_with_re2_search`` guards this use
    of the binding's internals."""
    return program._regexp.Match, re2._Anchor.UNANCHORED


def _searcher(program: Any) -> Callable[[str], bool]:
    run, unanchored = _program(program)

    def search(v: str) -> bool:
        text = v.encode()
        return run(unanchored, text, 0, len(text))[0] != _NO_MATCH

    return search


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """One rule ready to evaluate: ``route`` is lower-cased (the model field is
    case-insensitive); ``clauses`` counts its leaf comparisons."""

    index: int
    name: str
    route: str
    clauses: int
    _root: AllOf

    def matches(self, params: Values, metadata: Values) -> bool:
        """Whether the condition holds. Never raises."""
        return self._root.match(params, metadata)

    def failure(self, params: Values, metadata: Values) -> Failed | None:
        """None when the rule matches, else the first clause that failed."""
        return self._root.failure(params, metadata)


@dataclass(frozen=True, slots=True)
class RuleTrace:
    """One rule's outcome for explain: matched, usable by the caller, or the failed clause."""

    name: str
    route: str
    matched: bool
    usable: bool
    failed: Failed | None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form explain answers."""
        out: dict[str, Any] = {"name": self.name, "route": self.route, "matched": self.matched}
        if self.matched and not self.usable:
            out["skipped"] = "the route is not available to the caller's organisation"
        if self.failed is not None:
            out["failed"] = {"path": self.failed.path}
            if self.failed.missing:
                out["failed"]["missing"] = True
            elif self.failed.value is not None:
                out["failed"]["value"] = self.failed.value
        return out


def _always(route: str) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class CompiledRules:
    """An ordered, compiled rule set; empty when there are none (or they are disabled).
    ``cost`` is the matching work of its worst request, in ``schemas.rule_cost`` units."""

    rules: tuple[CompiledRule, ...] = ()
    cost: int = 0

    def first(
        self, params: Values, metadata: Values, usable: Callable[[str], bool] = _always
    ) -> CompiledRule | None:
        """The first rule that matches and whose route ``usable`` accepts (a rule naming a
        chain the caller's organisation may not use falls through to the next). Never
        raises."""
        for rule in self.rules:
            if rule._root.match(params, metadata) and usable(rule.route):
                return rule
        return None

    def patterns(self) -> list[Any]:
        """Every ``$regex`` of the set, compiled (RE2 programs: ``pattern``, ``programsize``)."""
        return [
            leaf.pattern
            for rule in self.rules
            for leaf in _leaves(rule._root)
            if leaf.pattern is not None
        ]

    def explain(
        self, params: Values, metadata: Values, usable: Callable[[str], bool] = _always
    ) -> list[RuleTrace]:
        """Every rule in order with its outcome (the live path's :meth:`first` is the first
        trace that is matched and usable)."""
        traces = []
        for rule in self.rules:
            failed = rule.failure(params, metadata)
            traces.append(
                RuleTrace(
                    rule.name,
                    rule.route,
                    failed is None,
                    failed is None and usable(rule.route),
                    failed,
                )
            )
        return traces


def _leaves(node: Node) -> list[Leaf]:
    if isinstance(node, Leaf):
        return [node]
    return [leaf for c in node.children for leaf in _leaves(c)]
