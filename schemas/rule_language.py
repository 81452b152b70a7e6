"""The routing rule language: validate a rule set and compile it to the match trees of
``schemas.rule_match``, which evaluate it per request.

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
from collections.abc import Sequence
from typing import Any

import re2

from schemas.errors import InvalidRequestError
from schemas.names import has_unprintable
from schemas.rule_cost import NODE_UNITS, comparison_units, regex_units
from schemas.rule_match import (
    AllOf,
    AnyOf,
    Comparison,
    CompiledRule,
    CompiledRules,
    Leaf,
    Node,
    leaf_match,
)
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
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
_RE2_OPTIONS.never_capture = True
# Per pattern; a pattern needing more is refused. It bounds what compiling an oversized pattern
# costs before its size is known (``\PN{90}`` is refused in under a millisecond, where compiling
# it took 14 ms), and leaves RE2 no room for its DFA, so every search runs the automaton whose
# time is linear in program and text, as ``schemas.rule_cost`` charges: with 64 KiB the DFA
# filled its cache and gave up on each search of some mid-sized patterns before that ran,
# which cost three times their charge per unit (``\b(?:\C|\b){14}x``: 106 us, now 38).
_RE2_OPTIONS.max_mem = 8 << 10


class RuleSetError(InvalidRequestError):
    """A rule set is invalid; ``param`` is the path of the first problem
    (``rules[3].when.$and[1].metadata.team.$regex``) and the message starts with it."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}", param=path)
        self.path = path


def parse_rule_set(raw: Any) -> tuple[Rule, ...]:
    """The rules of a wire set ``{"rules": [...]}``, shape-checked (conditions are checked by
    :func:`compile_rules`). Raises RuleSetError naming the first problem."""
    if not isinstance(raw, dict) or set(raw) != {"rules"}:
        # No "rules" is no set (``{}`` sent in error wiped the set): clearing it says [].
        raise RuleSetError("rules", 'a rule set is an object {"rules": [...]} (none: [])')
    items = raw["rules"]
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
        if has_unprintable(name):
            raise RuleSetError(f"{path}.name", "no control characters or line separators")
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


def _condition(cond: Any, path: str, depth: int, tally: _Tally) -> AllOf:
    if depth > MAX_DEPTH:
        raise RuleSetError(path, f"nested deeper than {MAX_DEPTH} levels of $and/$or")
    if not isinstance(cond, dict):
        raise RuleSetError(path, "a condition is an object")
    tally.charge(NODE_UNITS, path)  # an empty {} costs a call too
    nodes: list[Node] = []
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
            nodes.append(AllOf(sub, children) if key == "$and" else AnyOf(sub, children))
        elif key.startswith("$"):
            raise RuleSetError(
                sub,
                "unknown operator here (a condition combines with "
                "$and/$or; comparisons go under a field)",
            )
        else:
            _check_field(key, sub)
            nodes.extend(_field(key, value, sub, tally))
    return AllOf(path, tuple(nodes))


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


def _field(key: str, value: Any, path: str, tally: _Tally) -> list[Leaf]:
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
            program = _regex(operand, sub)
            tally.charge(regex_units(key, program.programsize), sub)
            comparison, negated = Comparison("$regex", program), False
        else:
            comparison, negated = _operator(op, operand, sub)
            values = len(operand) if op in ("$in", "$nin") else 0
            tally.charge(comparison_units(key, values), sub)
        pattern = comparison.operand if op == "$regex" else None
        leaves.append(Leaf(sub, key, leaf_match(key, comparison, negated), pattern))
    return leaves


def _scalar(value: Any, path: str) -> str:
    kind = _KINDS.get(type(value))
    if kind is None:
        raise RuleSetError(path, "values are strings, numbers or booleans")
    return kind


def _operator(op: str, operand: Any, path: str) -> tuple[Comparison, bool]:
    """(the comparison, whether the operator is its negation) of one operator other than
    ``$regex``: ``$ne`` is not ``$eq``, ``$nin`` is not ``$in``."""
    if op in ("$in", "$nin"):
        if not isinstance(operand, list) or len(operand) > MAX_IN_VALUES:
            raise RuleSetError(path, f"must be a list of at most {MAX_IN_VALUES} values")
        kinds = [_scalar(v, f"{path}[{j}]") for j, v in enumerate(operand)]
        by_type = {
            t: frozenset(v for k, v in zip(kinds, operand, strict=True) if k == kind)
            for t, kind in _KINDS.items()
        }
        return Comparison("$in", by_type), op == "$nin"
    types = _TYPES[_scalar(operand, path)]
    if op in ("$eq", "$ne"):
        return Comparison("$eq", operand, types), op == "$ne"
    return Comparison(op, operand, types), False


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
