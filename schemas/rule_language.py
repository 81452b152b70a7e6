"""The routing rule language: validate and compile a rule set, evaluate it per request.

Pure functions, no I/O: the RulesActor validates a set before storing it, every ingress
compiles the published set once and evaluates it on each ``model: "auto"`` request.

A condition is a JSON object. Each key is ``$and`` or ``$or`` (a non-empty list of
conditions) or a field: ``params.<name>`` (``schemas.rules.PARAMS``) or ``metadata.<label>``.
A field's value is a literal (``$eq``) or an object of operators, all of which must hold:
``$eq $ne $gt $gte $lt $lte $in $nin $regex``. MongoDB's query semantics where the issue is
silent: a plain object of fields means ``$and``; ``$ne``/``$nin`` match a missing field and
every other operator is false on one; comparing mismatched types is false (a boolean is not
a number), never an error; on a list field (``params.modalities``) an operator holds when it
holds for any element (``$ne``/``$nin``: for none); ``$regex`` searches, unanchored.

Regular expressions compile with RE2, which runs in time linear in the input and in the
compiled program; a pattern RE2 cannot take (backreferences, lookaround) is refused. Linear is
not cheap: a set is refused unless its worst request stays within ``MAX_RULE_SET_UNITS`` of
matching work (``schemas.rule_cost``), each pattern within ``MAX_REGEX_PROGRAM`` instructions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import re2

from schemas.errors import InvalidRequestError
from schemas.rule_cost import NODE_UNITS, comparison_units, regex_units
from schemas.rules import (
    MAX_CLAUSES,
    MAX_DEPTH,
    MAX_IN_VALUES,
    MAX_NAME_CHARS,
    MAX_REGEX_CHARS,
    MAX_REGEX_PROGRAM,
    MAX_RULE_SET_UNITS,
    MAX_RULES,
    PARAMS,
    Rule,
)

Values = Mapping[str, Any]
_MISSING = object()
# A rule routes to ``auto:<chain>`` or ``auto:<axis>``; the name follows the chain-name rule.
_ROUTE = re.compile(r"^auto:[a-z0-9][a-z0-9_-]{0,63}$")
_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$regex")
_PARAMS = frozenset(PARAMS)
# Values are typed by kind; values of two kinds never compare (True is not 1).
_KINDS: dict[type, str] = {bool: "bool", int: "number", float: "number", str: "string"}
_TYPES: dict[str, frozenset[type]] = {
    "bool": frozenset({bool}),
    "number": frozenset({int, float}),
    "string": frozenset({str}),
}
# Fields whose value is a list: an operator holds when it holds for any element ($ne and
# $nin: for none).
_LIST_FIELDS = frozenset({"params.modalities"})
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
_RE2_OPTIONS.never_capture = True
# Per pattern; a pattern needing more is refused. It also bounds what compiling an oversized
# pattern costs before its size is known (``\PN{90}`` is refused in under a millisecond, where
# compiling it took 14 ms).
_RE2_OPTIONS.max_mem = 64 << 10


class RuleSetError(InvalidRequestError):
    """A rule set is invalid; ``param`` is the path of the first problem
    (``rules[3].when.$and[1].metadata.team.$regex``) and the message starts with it."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}", param=path)
        self.path = path


# -- the compiled form ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Failed:
    """Why a rule did not match: the path of the first failing clause, its field's value."""

    path: str
    value: Any = None
    missing: bool = False


Match = Callable[[Values, Values], bool]  # (params, metadata) -> whether a condition holds


class _Leaf:
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


class _All:
    __slots__ = ("children", "match", "path")
    match: Match

    def __init__(self, path: str, children: tuple[_Node, ...]) -> None:
        self.path = path
        self.children = children
        self.match = _all_of(tuple(c.match for c in children))

    def failure(self, params: Values, metadata: Values) -> Failed | None:
        for c in self.children:
            failed = c.failure(params, metadata)
            if failed is not None:
                return failed
        return None


class _Any:
    __slots__ = ("children", "match", "path")
    match: Match

    def __init__(self, path: str, children: tuple[_Node, ...]) -> None:
        self.path = path
        self.children = children
        self.match = _any_of(tuple(c.match for c in children))

    def failure(self, params: Values, metadata: Values) -> Failed | None:
        # No single clause is to blame when every alternative failed: name the $or.
        return None if self.match(params, metadata) else Failed(self.path)


_Node = _Leaf | _All | _Any


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


def _leaf_match(field: str, test: Callable[[Any], bool], negated: bool) -> Match:
    """The closure of one comparison: look ``field`` up and ``test`` it (any element of a
    list-valued field), negated for ``$ne``/``$nin``, which alone match a missing field."""
    namespace, key = field.split(".", 1)
    if field in _LIST_FIELDS:
        test = _any_element(test)
    if negated:
        positive = test
        test = lambda v: not positive(v)  # noqa: E731 - one expression, bound once
    missing = negated
    if namespace == "params":

        def in_params(p: Values, m: Values) -> bool:
            v = p.get(key, _MISSING)
            return missing if v is _MISSING else test(v)

        return in_params

    def in_metadata(p: Values, m: Values) -> bool:
        v = m.get(key, _MISSING)
        return missing if v is _MISSING else test(v)

    return in_metadata


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """One rule ready to evaluate: ``route`` is lower-cased (the model field is
    case-insensitive); ``clauses`` counts its leaf comparisons."""

    index: int
    name: str
    route: str
    clauses: int
    _root: _All

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


def _leaves(node: _Node) -> list[_Leaf]:
    if isinstance(node, _Leaf):
        return [node]
    return [leaf for c in node.children for leaf in _leaves(c)]


# -- validation and compilation -------------------------------------------------------------


def parse_rule_set(raw: Any) -> tuple[Rule, ...]:
    """The rules of a wire set ``{"rules": [...]}``, shape-checked (conditions are checked by
    :func:`compile_rules`). Raises RuleSetError naming the first problem."""
    if not isinstance(raw, dict) or set(raw) - {"rules"}:
        raise RuleSetError("rules", 'a rule set is an object {"rules": [...]}')
    items = raw.get("rules", [])
    if not isinstance(items, list):
        raise RuleSetError("rules", "must be a list of rules")
    if len(items) > MAX_RULES:
        raise RuleSetError("rules", f"at most {MAX_RULES} rules (got {len(items)})")
    rules = []
    for i, item in enumerate(items):
        path = f"rules[{i}]"
        if not isinstance(item, dict):
            raise RuleSetError(path, "a rule is an object {name, when, route}")
        extra = sorted(set(item) - {"name", "when", "route"})
        if extra:
            raise RuleSetError(f"{path}.{extra[0]}", "unknown key (a rule has name, when, route)")
        for key in ("name", "route"):
            if not isinstance(item.get(key), str):
                raise RuleSetError(f"{path}.{key}", "required, a string")
        if not isinstance(item.get("when"), dict):
            raise RuleSetError(f"{path}.when", "required, an object (a condition)")
        rules.append(Rule(name=item["name"], when=item["when"], route=item["route"]))
    return tuple(rules)


class _Tally:
    """The comparisons of the rule being compiled and the work of the set so far; refuses at
    the first part past a bound, so an oversized set costs little to refuse."""

    __slots__ = ("clauses", "units")

    def __init__(self) -> None:
        self.clauses = 0
        self.units = 0

    def comparison(self, path: str) -> None:
        self.clauses += 1
        if self.clauses > MAX_CLAUSES:
            raise RuleSetError(path, f"more than {MAX_CLAUSES} comparisons in one rule")

    def charge(self, units: int, path: str) -> None:
        self.units += units
        if self.units > MAX_RULE_SET_UNITS:
            raise RuleSetError(
                path,
                f"the rule set's matching work per request exceeds its budget of "
                f"{MAX_RULE_SET_UNITS:,} units here ({self.units - units:,} before this part "
                f"of {units:,}); a $regex costs most, by its compiled size: use fewer or "
                f"simpler patterns",
            )


def compile_rules(rules: Sequence[Rule]) -> CompiledRules:
    """Validate and compile ``rules`` within every bound, the set's matching budget included.
    Raises RuleSetError naming the first problem."""
    if len(rules) > MAX_RULES:
        raise RuleSetError("rules", f"at most {MAX_RULES} rules (got {len(rules)})")
    seen: set[str] = set()
    out = []
    tally = _Tally()
    for i, rule in enumerate(rules):
        path = f"rules[{i}]"
        name = rule.name.strip()
        if not name or len(name) > MAX_NAME_CHARS:
            raise RuleSetError(f"{path}.name", f"1 to {MAX_NAME_CHARS} characters")
        if name in seen:
            raise RuleSetError(f"{path}.name", f"another rule is already named {name!r}")
        seen.add(name)
        route = rule.route.strip().lower()
        if not _ROUTE.match(route):
            raise RuleSetError(f"{path}.route", "must be auto:<chain> or auto:<axis>")
        tally.clauses = 0
        root = _condition(rule.when, f"{path}.when", 1, tally)
        out.append(CompiledRule(i, name, route, tally.clauses, root))
    return CompiledRules(tuple(out), tally.units)


def _condition(cond: Any, path: str, depth: int, tally: _Tally) -> _All:
    if depth > MAX_DEPTH:
        raise RuleSetError(path, f"nested deeper than {MAX_DEPTH} levels of $and/$or")
    if not isinstance(cond, dict):
        raise RuleSetError(path, "a condition is an object")
    tally.charge(NODE_UNITS, path)  # an empty {} costs a call too
    nodes: list[_Node] = []
    for key, value in cond.items():
        if not isinstance(key, str):
            raise RuleSetError(path, "condition keys are strings")
        sub = f"{path}.{key}"
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                raise RuleSetError(sub, "must be a non-empty list of conditions")
            children = tuple(
                _condition(c, f"{sub}[{j}]", depth + 1, tally) for j, c in enumerate(value)
            )
            nodes.append(_All(sub, children) if key == "$and" else _Any(sub, children))
        elif key.startswith("$"):
            raise RuleSetError(
                sub,
                "unknown operator here (a condition combines with "
                "$and/$or; comparisons go under a field)",
            )
        else:
            _check_field(key, sub)
            nodes.extend(_field(key, value, sub, tally))
    return _All(path, tuple(nodes))


def _check_field(key: str, path: str) -> None:
    namespace, _, name = key.partition(".")
    if namespace == "params" and name in _PARAMS:
        return
    if namespace == "metadata" and name:
        return
    raise RuleSetError(
        path,
        f"unknown field: conditions read params.<name> ({', '.join(PARAMS)}) or metadata.<label>",
    )


def _field(key: str, value: Any, path: str, tally: _Tally) -> list[_Leaf]:
    if isinstance(value, dict):
        if not value:
            raise RuleSetError(path, "an empty operator object")
        ops: list[tuple[Any, Any]] = list(value.items())
    else:
        ops = [("$eq", value)]  # a literal means $eq; its problems are the field's
    leaves = []
    for op, operand in ops:
        sub = path if not isinstance(value, dict) else f"{path}.{op}"
        if op not in _OPERATORS:
            raise RuleSetError(sub, f"unknown operator; use one of {', '.join(_OPERATORS)}")
        tally.comparison(sub)
        if op == "$regex":
            pattern = _regex(operand, sub)
            tally.charge(regex_units(key, pattern.programsize), sub)
            leaves.append(_Leaf(sub, key, _leaf_match(key, _searcher(pattern), False), pattern))
        else:
            test, negated = _operator(op, operand, sub)
            values = len(operand) if op in ("$in", "$nin") else 0
            tally.charge(comparison_units(key, values), sub)
            leaves.append(_Leaf(sub, key, _leaf_match(key, test, negated)))
    return leaves


def _scalar(value: Any, path: str) -> str:
    kind = _KINDS.get(type(value))
    if kind is None:
        raise RuleSetError(path, "values are strings, numbers or booleans")
    return kind


def _operator(op: str, operand: Any, path: str) -> tuple[Callable[[Any], bool], bool]:
    """(test of a present value, whether the operator is its negation) of one comparison:
    ``$ne`` is not ``$eq``, ``$nin`` is not ``$in``."""
    if op in ("$in", "$nin"):
        if not isinstance(operand, list) or len(operand) > MAX_IN_VALUES:
            raise RuleSetError(path, f"must be a list of at most {MAX_IN_VALUES} values")
        keys = frozenset((_scalar(v, f"{path}[{j}]"), v) for j, v in enumerate(operand))

        def member(v: Any) -> bool:
            kind = _KINDS.get(type(v))
            return kind is not None and (kind, v) in keys  # (never hashes a list)

        return member, op == "$nin"
    types = _TYPES[_scalar(operand, path)]
    if op in ("$eq", "$ne"):
        return (lambda v: type(v) in types and v == operand), op == "$ne"
    compare = _ORDER[op]
    return (lambda v: type(v) in types and compare(v, operand)), False


_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "$gt": lambda a, b: a > b,
    "$gte": lambda a, b: a >= b,
    "$lt": lambda a, b: a < b,
    "$lte": lambda a, b: a <= b,
}


def _any_element(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """``test`` of a value, or of any element of a list value (``params.modalities``)."""

    def run(v: Any) -> bool:
        if isinstance(v, list | tuple):
            return any(test(x) for x in v)
        return test(v)

    return run


def _regex(pattern: Any, path: str) -> Any:
    """``pattern`` compiled by RE2. Raises RuleSetError when it is not one RE2 takes, or its
    program is larger than ``MAX_REGEX_PROGRAM``."""
    if not isinstance(pattern, str) or not pattern:
        raise RuleSetError(path, "must be a non-empty string")
    if len(pattern) > MAX_REGEX_CHARS:
        raise RuleSetError(path, f"at most {MAX_REGEX_CHARS} characters")
    try:
        compiled = re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise RuleSetError(
            path, f"not a pattern the linear-time engine (RE2) takes: {detail}"
        ) from None
    if compiled.programsize > MAX_REGEX_PROGRAM:
        raise RuleSetError(
            path,
            f"compiles to {compiled.programsize} RE2 instructions, at most "
            f"{MAX_REGEX_PROGRAM} (counted repetitions and Unicode classes such as \\pL "
            f"multiply them)",
        )
    return compiled


def _searcher(compiled: Any) -> Callable[[Any], bool]:
    search = compiled.search
    # Searched as UTF-8 bytes: the same match, and the binding then maps no offsets back to
    # characters, which costs a matching search more than the match itself.
    return lambda v: type(v) is str and search(v.encode()) is not None
