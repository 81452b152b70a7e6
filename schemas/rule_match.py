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
from typing import Any

Values = Mapping[str, Any]
_MISSING = object()
# Fields whose value is a list: an operator holds when it holds for any element ($ne and
# $nin: for none).
_LIST_FIELDS = frozenset({"params.modalities"})
_SEQUENCES = (list, tuple)


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


def leaf_match(field: str, test: Callable[[Any], bool], negated: bool) -> Match:
    """The closure of one comparison: look ``field`` up and ``test`` it (any element of a
    list-valued field), negated for ``$ne``/``$nin``, which alone match a missing field."""
    namespace, key = field.split(".", 1)
    if field in _LIST_FIELDS:
        test = _any_element(test)
    # One closure per case, so a clause costs its lookup and one call of ``test``: a
    # negation wrapped around ``test`` was a second call per clause, about a fifth more.
    if namespace == "params":
        if negated:

            def not_in_params(p: Values, m: Values) -> bool:
                v = p.get(key, _MISSING)
                return v is _MISSING or not test(v)

            return not_in_params

        def in_params(p: Values, m: Values) -> bool:
            v = p.get(key, _MISSING)
            return v is not _MISSING and test(v)

        return in_params
    if negated:

        def not_in_metadata(p: Values, m: Values) -> bool:
            v = m.get(key, _MISSING)
            return v is _MISSING or not test(v)

        return not_in_metadata

    def in_metadata(p: Values, m: Values) -> bool:
        v = m.get(key, _MISSING)
        return v is not _MISSING and test(v)

    return in_metadata


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


def _any_element(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """``test`` of a value, or of any element of a list value (``params.modalities``)."""

    def run(v: Any) -> bool:
        if isinstance(v, _SEQUENCES):
            # A loop, not any() over a generator: building the generator cost more than
            # testing the four elements a request may list.
            for x in v:
                if test(x):
                    return True
            return False
        return test(v)

    return run
