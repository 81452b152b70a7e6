"""The matching budget of a rule set: what a set may cost per request, and that refusing an
oversized one is cheap. The worst admissible sets are built in ``tests.fixtures.rule_sets``;
their time is measured by ``tests/benchmarks/rules_cost.py``, not here (no timed asserts)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import pytest
import re2

from schemas.keys import ROLES
from schemas.rule_cost import (
    COMPARISON_UNITS,
    IN_VALUE_UNITS,
    NODE_UNITS,
    PARAM_TEXT_BYTES,
    REGEX_CALL_UNITS,
    REGEX_STEP_UNITS,
    regex_units,
)
from schemas.rule_language import RuleSetError, compile_rules
from schemas.rule_match import CompiledRules
from schemas.rules import (
    MAX_CLAUSES,
    MAX_LABEL_BYTES,
    MAX_REGEX_PROGRAM,
    MAX_RULE_SET_UNITS,
    MAX_RULES,
    Rule,
)
from tests.fixtures.rule_sets import ALPHABETS, KINDS, PARAMS, labels, worst_set

if TYPE_CHECKING:
    from collections.abc import Callable


def _set(*whens: dict[str, Any]) -> list[Rule]:
    return [Rule(name=f"r{i}", when=w, route="auto:a") for i, w in enumerate(whens)]


def _refusal(rules: list[Rule]) -> RuleSetError:
    with pytest.raises(RuleSetError) as info:
        compile_rules(rules)
    return info.value


def _issue_set(pattern: Callable[[int], str]) -> list[Rule]:
    """The issue's shape: 100 rules of 64 ``$regex`` comparisons, none matching."""
    return _set(
        *(
            {"$or": [{f"metadata.k{j}": {"$regex": pattern(i * 64 + j)}} for j in range(64)]}
            for i in range(MAX_RULES)
        )
    )


class _WorstSets(dict[str, list[Rule]]):
    """Each worst set, built when a test first asks for it (a test needs one or two, and
    under xdist each worker builds only what its own tests read)."""

    def __missing__(self, kind: str) -> list[Rule]:
        built = self[kind] = worst_set(kind)
        return built


@pytest.fixture(scope="module")
def worst() -> dict[str, list[Rule]]:
    """The worst sets, each built once for the module."""
    return _WorstSets()


@pytest.mark.parametrize("name", KINDS)
def test_each_worst_set_fills_the_budget_with_distinct_parts_and_stays_within_it(
    worst: dict[str, list[Rule]], name: str
) -> None:
    compiled = compile_rules(worst[name])
    patterns = [p.pattern for p in compiled.patterns()]

    # Full to within one part: a matching $regex part costs up to 5 % of the budget.
    assert MAX_RULE_SET_UNITS * 0.95 <= compiled.cost <= MAX_RULE_SET_UNITS
    assert len(set(patterns)) == len(patterns)  # no pattern repeats: no cache is the bound
    assert all(p.programsize <= MAX_REGEX_PROGRAM for p in compiled.patterns())
    assert all(r.clauses <= MAX_CLAUSES for r in compiled.rules)
    assert len(compiled.rules) <= MAX_RULES


@pytest.mark.parametrize("alphabet", ALPHABETS.values(), ids=ALPHABETS.keys())
@pytest.mark.parametrize("name", KINDS)
def test_the_worst_labels_match_no_rule_so_every_part_is_evaluated(
    worst: dict[str, list[Rule]], name: str, alphabet: str
) -> None:
    metadata = labels(random.Random(name), alphabet)

    assert all(len(v.encode()) == MAX_LABEL_BYTES for v in metadata.values())
    assert compile_rules(worst[name]).first(PARAMS, metadata) is None


def test_the_heaviest_patterns_are_charged_for_every_instruction_on_every_label_byte(
    worst: dict[str, list[Rule]],
) -> None:
    heavy = compile_rules(worst["regex_heavy"])
    sizes = [p.programsize for p in heavy.patterns()]
    search_steps = sum(sizes) * MAX_LABEL_BYTES  # RE2's worst: each instruction, each byte

    assert max(sizes) > MAX_REGEX_PROGRAM * 0.9  # the set holds near-largest programs
    assert REGEX_STEP_UNITS * search_steps + REGEX_CALL_UNITS * len(sizes) <= heavy.cost
    assert heavy.cost <= MAX_RULE_SET_UNITS


def test_the_charge_of_each_part() -> None:
    empty = compile_rules(_set({})).cost
    eq = compile_rules(_set({"metadata.a": "x"})).cost
    in_list = compile_rules(_set({"metadata.a": {"$in": ["x", "y", "z"]}})).cost
    on_list_field = compile_rules(_set({"params.modalities": "image"})).cost
    pattern = re2.compile("^te+am$")
    regex = compile_rules(_set({"metadata.a": {"$regex": "^te+am$"}})).cost
    regex_on_param = compile_rules(_set({"params.role": {"$regex": "^te+am$"}})).cost
    regex_on_list = compile_rules(_set({"params.modalities": {"$regex": "^te+am$"}})).cost
    nested = compile_rules(_set({"$or": [{}, {"$and": [{}]}]})).cost

    assert empty == NODE_UNITS
    assert eq - empty == COMPARISON_UNITS
    assert in_list - empty == COMPARISON_UNITS + 3 * IN_VALUE_UNITS
    assert on_list_field - empty == 4 * COMPARISON_UNITS  # up to 4 modalities
    assert regex - empty == REGEX_CALL_UNITS + REGEX_STEP_UNITS * MAX_LABEL_BYTES * (
        pattern.programsize
    )
    assert regex_on_param - empty == REGEX_CALL_UNITS + REGEX_STEP_UNITS * PARAM_TEXT_BYTES * (
        pattern.programsize
    )
    assert regex_on_list - empty == 4 * (regex_on_param - empty)
    assert nested - empty == 3 * NODE_UNITS  # {}, {"$and": ...} and its {}


def test_params_strings_are_within_the_text_bound_their_regexes_are_charged_for() -> None:
    names = (*ROLES, "chat", "responses", "messages", "embeddings", "text", "image", "audio")
    assert max(len(n.encode()) for n in (*names, "file")) <= PARAM_TEXT_BYTES


def test_one_part_past_the_budget_is_refused_naming_its_path_and_the_budget(
    worst: dict[str, list[Rule]],
) -> None:
    full = worst["regex_calls_no_match"]
    more = [*full, Rule(name="more", when={"metadata.k0": {"$regex": "^more$"}}, route="auto:a")]

    err = _refusal(more)

    assert err.path == f"rules[{len(full)}].when.metadata.k0.$regex"
    assert str(err).startswith(f"{err.path}: ")
    assert f"{MAX_RULE_SET_UNITS:,} units" in str(err)


def test_many_empty_conditions_are_charged_like_any_part() -> None:
    many: dict[str, Any] = {"$and": [{}] * (MAX_RULE_SET_UNITS // NODE_UNITS)}

    # The rule's own condition and all its elements but the last fill the budget.
    assert (
        _refusal(_set(many)).path == f"rules[0].when.$and[{MAX_RULE_SET_UNITS // NODE_UNITS - 1}]"
    )


def test_one_pattern_at_the_program_bound_on_a_label_fits_the_budget() -> None:
    # Else the program bound would promise what the budget refuses.
    assert NODE_UNITS + regex_units("metadata.a", MAX_REGEX_PROGRAM) <= MAX_RULE_SET_UNITS


def test_a_pattern_past_the_program_bound_is_refused() -> None:
    within, past = f"x{{{MAX_REGEX_PROGRAM - 8}}}", f"x{{{MAX_REGEX_PROGRAM}}}"

    assert compile_rules(_set({"metadata.a": {"$regex": within}})).patterns()
    err = _refusal(_set({"metadata.a": {"$regex": past}}))

    assert err.path == "rules[0].when.metadata.a.$regex"
    assert f"at most {MAX_REGEX_PROGRAM}" in str(err)


@pytest.mark.parametrize(
    "pattern",
    [lambda i: r"\PN{90}\d", lambda i: rf"\PN{{90}}\d{i}"],
    ids=["repeated", "distinct"],
)
def test_the_issue_sets_are_refused_at_their_first_pattern(
    pattern: Callable[[int], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    compiles = _count_compiles(monkeypatch)

    err = _refusal(_issue_set(pattern))

    assert err.path == "rules[0].when.$or[0].metadata.k0.$regex"
    assert compiles == [1]  # one pattern compiled, not 6,400


def test_many_small_distinct_patterns_are_refused_once_past_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compiles = _count_compiles(monkeypatch)
    cheapest = regex_units("metadata.k0", 1) + NODE_UNITS

    err = _refusal(_issue_set(lambda i: f"^q{i}z"))

    assert err.path.startswith(("rules[0].", "rules[1].", "rules[2]."))
    assert compiles[0] <= MAX_RULE_SET_UNITS // cheapest + 1  # of 6,400


def _count_compiles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    count = [0]
    real = re2.compile

    def counting(pattern: Any, options: Any = None) -> Any:
        count[0] += 1
        return real(pattern, options)

    monkeypatch.setattr(re2, "compile", counting)
    return count


def test_an_empty_set_costs_nothing() -> None:
    assert CompiledRules().cost == 0 and compile_rules([]).cost == 0
