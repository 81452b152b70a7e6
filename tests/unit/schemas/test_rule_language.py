"""The routing rule language: operators, MongoDB semantics, bounds, paths, explain."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest
import re2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import rule_language, rule_match
from schemas.rule_language import RuleSetError, compile_rules, parse_rule_set
from schemas.rules import (
    MAX_CLAUSES,
    MAX_DEPTH,
    MAX_REGEX_CHARS,
    MAX_RULES,
    PARAMS,
    Rule,
)

if TYPE_CHECKING:
    from schemas.rule_match import CompiledRules

PARAMS_SAMPLE: dict[str, Any] = {
    "surface": "chat",
    "stream": False,
    "prompt_tokens": 1200,
    "max_tokens": 256,
    "has_tools": True,
    "has_images": False,
    "modalities": ("text", "image"),
    "temperature": 0.2,
    "message_count": 3,
    "role": "user",
}


def one(when: dict[str, Any], route: str = "auto:coding") -> CompiledRules:
    return compile_rules([Rule(name="r", when=when, route=route)])


def hit(
    when: dict[str, Any],
    metadata: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
) -> bool:
    rules = one(when)
    return rules.first(PARAMS_SAMPLE if params is None else params, metadata or {}) is not None


def refused(when: dict[str, Any]) -> str:
    with pytest.raises(RuleSetError) as info:
        one(when)
    return info.value.path


# -- operators ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        ({"params.has_tools": True}, True),
        ({"params.has_tools": {"$eq": False}}, False),
        ({"params.surface": {"$ne": "messages"}}, True),
        ({"params.prompt_tokens": {"$gt": 1200}}, False),
        ({"params.prompt_tokens": {"$gte": 1200}}, True),
        ({"params.prompt_tokens": {"$lt": 1200}}, False),
        ({"params.prompt_tokens": {"$lte": 1200}}, True),
        ({"params.temperature": {"$lt": 0.5, "$gt": 0.1}}, True),
        ({"params.role": {"$in": ["admin", "user"]}}, True),
        ({"params.role": {"$nin": ["admin", "user"]}}, False),
        ({"params.surface": {"$regex": "ha"}}, True),  # searches, unanchored
        ({"params.surface": {"$regex": "^ha$"}}, False),
        ({"params.surface": {"$regex": "(?i)^CHAT$"}}, True),
    ],
)
def test_each_operator_compares_a_present_value(when: dict[str, Any], expected: bool) -> None:
    assert hit(when) is expected


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        ("$eq", False),
        ("$gt", False),
        ("$gte", False),
        ("$lt", False),
        ("$lte", False),
        ("$regex", False),
        ("$ne", True),
    ],
)
def test_a_missing_field_matches_only_ne_and_nin(op: str, expected: bool) -> None:
    assert hit({"metadata.team": {op: "x"}}) is expected


def test_in_and_nin_on_a_missing_field() -> None:
    assert not hit({"metadata.team": {"$in": ["a"]}})
    assert hit({"metadata.team": {"$nin": ["a"]}})


@pytest.mark.parametrize(
    "when",
    [
        {"params.prompt_tokens": {"$gt": "10"}},  # number against string
        {"params.prompt_tokens": "1200"},
        {"params.has_tools": 1},  # a boolean is not a number
        {"metadata.n": {"$in": [1]}},
        {"params.prompt_tokens": {"$regex": "12"}},  # $regex reads strings only
    ],
)
def test_mismatched_types_are_false_never_an_error(when: dict[str, Any]) -> None:
    assert not hit(when, {"n": True})


def test_a_list_field_matches_when_any_element_does() -> None:
    assert hit({"params.modalities": "image"})
    assert hit({"params.modalities": {"$in": ["audio", "image"]}})
    assert not hit({"params.modalities": {"$ne": "image"}})
    assert hit({"params.modalities": {"$nin": ["audio"]}})
    assert hit({"params.modalities": {"$regex": "^im"}})


def test_metadata_labels_of_each_type() -> None:
    meta = {"team": "search", "batch": True, "priority": 3, "team.sub": "x"}
    assert hit(
        {
            "metadata.team": "search",
            "metadata.batch": True,
            "metadata.priority": {"$gte": 3},
            "metadata.team.sub": "x",
        },
        meta,
    )
    assert not hit({"metadata.priority": 3.5}, meta)


def test_and_or_nesting() -> None:
    when = {
        "$or": [
            {"params.has_tools": False},
            {
                "$and": [
                    {"params.stream": False},
                    {"$or": [{"metadata.team": "a"}, {"params.prompt_tokens": {"$gt": 1000}}]},
                ]
            },
        ]
    }
    assert hit(when)
    assert not hit(when, params={**PARAMS_SAMPLE, "prompt_tokens": 10})
    assert hit(when, {"team": "a"}, params={**PARAMS_SAMPLE, "prompt_tokens": 10})


def test_an_empty_condition_matches_everything() -> None:
    assert hit({})


def test_first_match_wins_and_an_unusable_route_falls_through() -> None:
    rules = compile_rules(
        [
            Rule(name="tools", when={"params.has_tools": True}, route="auto:Coding"),
            Rule(name="long", when={"params.prompt_tokens": {"$gt": 100}}, route="auto:long"),
            Rule(name="all", when={}, route="auto:cheapest"),
        ]
    )
    first = rules.first(PARAMS_SAMPLE, {})
    assert first is not None and (first.name, first.route) == ("tools", "auto:coding")
    second = rules.first(PARAMS_SAMPLE, {}, usable=lambda route: route != "auto:coding")
    assert second is not None and second.name == "long"
    assert rules.first(PARAMS_SAMPLE, {}, usable=lambda route: False) is None


def test_explain_names_each_rule_and_the_first_failing_clause() -> None:
    rules = compile_rules(
        [
            Rule(
                name="big",
                when={"$and": [{"params.stream": False}, {"params.prompt_tokens": {"$gt": 5000}}]},
                route="auto:long",
            ),
            Rule(name="team", when={"metadata.team": "x"}, route="auto:t"),
            Rule(name="any", when={"$or": [{"metadata.a": 1}, {"metadata.b": 2}]}, route="auto:o"),
            Rule(name="tools", when={"params.has_tools": True}, route="auto:coding"),
        ]
    )
    traces = [
        t.to_dict() for t in rules.explain(PARAMS_SAMPLE, {}, usable=lambda r: r != "auto:coding")
    ]
    assert traces == [
        {
            "name": "big",
            "route": "auto:long",
            "matched": False,
            "failed": {"path": "rules[0].when.$and[1].params.prompt_tokens.$gt", "value": 1200},
        },
        {
            "name": "team",
            "route": "auto:t",
            "matched": False,
            "failed": {"path": "rules[1].when.metadata.team", "missing": True},
        },
        {
            "name": "any",
            "route": "auto:o",
            "matched": False,
            "failed": {"path": "rules[2].when.$or"},
        },
        {
            "name": "tools",
            "route": "auto:coding",
            "matched": True,
            "skipped": "the route is not available to the caller's organisation",
        },
    ]


# -- validation -----------------------------------------------------------------------------


def test_the_path_names_the_first_problem() -> None:
    rules = [Rule(name=f"r{i}", when={}, route="auto:a") for i in range(3)]
    rules.append(
        Rule(
            name="r3",
            when={"$and": [{"params.stream": True}, {"metadata.team": {"$regex": "(a)\\1"}}]},
            route="auto:a",
        )
    )
    with pytest.raises(RuleSetError) as info:
        compile_rules(rules)
    assert info.value.path == "rules[3].when.$and[1].metadata.team.$regex"
    assert info.value.message.startswith("rules[3].when.$and[1].metadata.team.$regex: ")
    assert info.value.param == info.value.path


@pytest.mark.parametrize(
    ("when", "path"),
    [
        ({"params.org": "x"}, "rules[0].when.params.org"),  # closed namespace
        ({"org": "x"}, "rules[0].when.org"),
        ({"params.role": {"$exists": True}}, "rules[0].when.params.role.$exists"),
        ({"$nor": []}, "rules[0].when.$nor"),
        ({"$and": []}, "rules[0].when.$and"),
        ({"$or": {"a": 1}}, "rules[0].when.$or"),
        ({"$and": ["x"]}, "rules[0].when.$and[0]"),
        ({"metadata.a": None}, "rules[0].when.metadata.a"),
        ({"metadata.a": {"b": 1}}, "rules[0].when.metadata.a.b"),
        ({"metadata.a": {}}, "rules[0].when.metadata.a"),
        ({"metadata.a": {"$in": "x"}}, "rules[0].when.metadata.a.$in"),
        ({"metadata.a": {"$in": [1, [2]]}}, "rules[0].when.metadata.a.$in[1]"),
        ({"metadata.a": {"$regex": "(?=x)"}}, "rules[0].when.metadata.a.$regex"),
        (
            {"metadata.a": {"$regex": "x" * (MAX_REGEX_CHARS + 1)}},
            "rules[0].when.metadata.a.$regex",
        ),
        ({"metadata.": 1}, "rules[0].when.metadata."),
    ],
)
def test_invalid_conditions_are_refused_with_their_path(when: dict[str, Any], path: str) -> None:
    assert refused(when) == path


def test_patterns_python_takes_but_re2_refuses_are_refused() -> None:
    re.compile("(a)\\1")  # Python's backtracking engine would take it ...
    assert refused({"metadata.a": {"$regex": "(a)\\1"}}) == "rules[0].when.metadata.a.$regex"


def test_a_regex_at_the_length_bound_is_taken() -> None:
    assert hit({"metadata.a": {"$regex": "x" * MAX_REGEX_CHARS}}, {"a": "x" * MAX_REGEX_CHARS})


def test_depth_bound() -> None:
    def nest(levels: int) -> dict[str, Any]:
        cond: dict[str, Any] = {"params.stream": False}
        for _ in range(levels - 1):
            cond = {"$and": [cond]}
        return cond

    assert hit(nest(MAX_DEPTH))
    path = refused(nest(MAX_DEPTH + 1))
    assert path == "rules[0].when" + ".$and[0]" * MAX_DEPTH


def test_clause_bound() -> None:
    fields = {f"metadata.k{i}": {"$ne": "x"} for i in range(MAX_CLAUSES)}
    assert hit(fields)
    assert refused({**fields, "metadata.last": {"$ne": 1}}) == "rules[0].when.metadata.last.$ne"


def test_rule_count_bound_and_rule_shape() -> None:
    ok = {"rules": [{"name": f"r{i}", "when": {}, "route": "auto:a"} for i in range(MAX_RULES)]}
    assert len(compile_rules(parse_rule_set(ok)).rules) == MAX_RULES
    too_many = {"rules": [*ok["rules"], {"name": "x", "when": {}, "route": "auto:a"}]}
    for raw, path in [
        (too_many, "rules"),
        ([], "rules"),
        ({"rules": [{"name": "a", "when": {}}]}, "rules[0].route"),
        ({"rules": [{"name": "a", "when": [], "route": "auto:a"}]}, "rules[0].when"),
        ({"rules": [{"name": "a", "when": {}, "route": "auto:a", "x": 1}]}, "rules[0].x"),
    ]:
        with pytest.raises(RuleSetError) as info:
            parse_rule_set(raw)
        assert info.value.path == path


@pytest.mark.parametrize(
    ("rules", "path"),
    [
        ([Rule(name="", when={}, route="auto:a")], "rules[0].name"),
        (
            [Rule(name="a", when={}, route="auto:a"), Rule(name="a", when={}, route="auto:b")],
            "rules[1].name",
        ),
        ([Rule(name="a", when={}, route="auto")], "rules[0].route"),
        ([Rule(name="a", when={}, route="gpt-4o")], "rules[0].route"),
        ([Rule(name="a", when={}, route="auto:a.b")], "rules[0].route"),
    ],
)
def test_names_and_routes_are_checked(rules: list[Rule], path: str) -> None:
    with pytest.raises(RuleSetError) as info:
        compile_rules(rules)
    assert info.value.path == path


# -- properties -----------------------------------------------------------------------------

scalars = st.one_of(
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
labels = st.text(st.characters(codec="utf-8", exclude_characters="."), min_size=1, max_size=8)
fields = st.one_of(
    st.sampled_from([f"params.{p}" for p in PARAMS]), labels.map(lambda k: f"metadata.{k}")
)
regexes = st.sampled_from(
    ["a", "^a+$", "(a+)+$", "(a|aa)*b", "(?i)x.*y", "[0-9]{2,5}", "(.*a){12}"]
)


def operator_clause() -> st.SearchStrategy[Any]:
    return st.one_of(
        scalars,
        st.fixed_dictionaries(
            {},
            optional={
                "$eq": scalars,
                "$ne": scalars,
                "$gt": scalars,
                "$gte": scalars,
                "$lt": scalars,
                "$lte": scalars,
                "$in": st.lists(scalars, max_size=4),
                "$nin": st.lists(scalars, max_size=4),
                "$regex": regexes,
            },
        ).filter(bool),
    )


leaf_conditions = st.dictionaries(fields, operator_clause(), max_size=3)
conditions = st.recursive(
    leaf_conditions,
    lambda inner: st.one_of(
        st.builds(lambda xs: {"$and": xs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda xs: {"$or": xs}, st.lists(inner, min_size=1, max_size=3)),
    ),
    max_leaves=6,
)
param_values = st.fixed_dictionaries(
    {},
    optional={
        p: st.one_of(scalars, st.lists(st.sampled_from(["text", "image", "audio"]), max_size=3))
        for p in PARAMS
    },
)
metadata_values = st.dictionaries(labels, scalars, max_size=6)


# 100 examples, as for the per-clause property below over the same rule sets: drawing one
# takes ~0.1 s (the drawing, not the rules), so 300 cost 27 s of the suite.
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(conditions, min_size=1, max_size=5), param_values, metadata_values)
def test_random_valid_rule_sets_compile_and_never_raise(
    whens: list[dict[str, Any]], params: dict[str, Any], metadata: dict[str, Any]
) -> None:
    try:
        rules = compile_rules(
            [Rule(name=f"r{i}", when=w, route="auto:a") for i, w in enumerate(whens)]
        )
    except RuleSetError as err:  # a random set may pass a size bound: refused, and said so
        assert "comparisons in one rule" in str(err) or "budget" in str(err)
        return
    first = rules.first(params, metadata)
    traces = rules.explain(params, metadata)
    matched = [t.name for t in traces if t.matched]
    assert (first.name if first else None) == (matched[0] if matched else None)
    for t in traces:
        assert t.matched is (t.failed is None)
        t.to_dict()


json_values = st.recursive(
    st.one_of(st.none(), scalars),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.one_of(
                st.sampled_from(
                    [
                        "$and",
                        "$or",
                        "$in",
                        "$regex",
                        "$gt",
                        "params.role",
                        "metadata.x",
                        "name",
                        "when",
                        "route",
                        "rules",
                    ]
                ),
                st.text(max_size=5),
            ),
            inner,
            max_size=3,
        ),
    ),
    max_leaves=10,
)


@settings(max_examples=300)
@given(json_values)
def test_arbitrary_json_is_taken_or_refused_with_a_path(raw: Any) -> None:
    for candidate in (raw, {"rules": [{"name": "a", "when": raw, "route": "auto:a"}]}):
        try:
            compile_rules(parse_rule_set(candidate))
        except RuleSetError as err:
            assert err.path.startswith("rules")


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(conditions, min_size=1, max_size=5), param_values, metadata_values)
def test_evaluation_does_at_most_one_test_per_clause(
    monkeypatch: pytest.MonkeyPatch,
    whens: list[dict[str, Any]],
    params: dict[str, Any],
    metadata: dict[str, Any],
) -> None:
    calls = [0]
    build = rule_match.leaf_match

    def counting(*args: Any) -> Any:
        match = build(*args)

        def counted(p: Any, m: Any) -> bool:
            calls[0] += 1
            return bool(match(p, m))

        return counted

    with monkeypatch.context() as patched:
        patched.setattr(rule_language, "leaf_match", counting)
        try:
            rules = compile_rules(
                [Rule(name=f"r{i}", when=w, route="auto:a") for i, w in enumerate(whens)]
            )
        except RuleSetError as err:  # past a bound: nothing to evaluate
            assert "comparisons in one rule" in str(err) or "budget" in str(err)
            return
    rules.first(params, metadata)

    assert calls[0] <= sum(r.clauses for r in rules.rules)


def test_every_regex_is_an_re2_program_even_a_catastrophic_one() -> None:
    bomb = "(a+)+$"
    rules = one({"metadata.label": {"$regex": bomb}, "metadata.other": {"$regex": "(x|xx)*y"}})
    assert rules.patterns() and all(isinstance(p, re2._Regexp) for p in rules.patterns())
    # 4 KiB of 'a' ending in 'b': exponential for a backtracking engine, linear for RE2.
    assert rules.first({}, {"label": "a" * 4095 + "b", "other": "x" * 4000}) is None


# -- the fused comparisons agree with the reference tests ---------------------------------

patterns = st.sampled_from(["a", "^a+$", "é", "^.{3}$", r"\bb", "(?i)X", "中😀", "$", "^$"])
texts = st.text(st.characters(codec="utf-8"), max_size=40)


@settings(max_examples=300)
@given(patterns, texts)
def test_the_direct_search_agrees_with_re2_search(pattern: str, text: str) -> None:
    # Evaluation calls the binding's RE2 object with UTF-8 bytes, not ``search``.
    program = re2.compile(pattern, rule_language._RE2_OPTIONS)
    expected = program.search(text) is not None

    assert rule_match.element_test(rule_match.Comparison("$regex", program))(text) is expected
    assert hit({"metadata.t": {"$regex": pattern}}, {"t": text}) is expected


operators = st.sampled_from(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin"])
values = st.one_of(scalars, st.lists(scalars, max_size=2), st.none())


@settings(max_examples=500)
@given(operators, scalars, st.lists(scalars, max_size=4), st.booleans(), values)
def test_each_comparison_agrees_with_its_test_of_one_value(
    op: str, literal: Any, members: list[Any], missing: bool, value: Any
) -> None:
    # A scalar field's closure does the lookup and the test in one call; the list field's
    # path (and MongoDB's definition) is the test of one value, negated for $ne/$nin.
    operand = members if op in ("$in", "$nin") else literal
    comparison, negated = rule_language._operator(op, operand, "p")
    test = rule_match.element_test(comparison)
    expected = negated if missing else test(value) is not negated
    fields = {} if missing else {"x": value}

    for field, params, metadata in (("params.x", fields, {}), ("metadata.x", {}, fields)):
        assert rule_match.leaf_match(field, comparison, negated)(params, metadata) is expected
