"""``echo_values.example``: a value valid under the schemas SDK helpers send."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from gateway.adapters.echo_values import example


class Leaf(BaseModel):
    name: str = Field(min_length=5, max_length=8)
    size: int = Field(ge=3, multiple_of=4)


class Tree(BaseModel):
    """Recursive ($ref to itself), nested, optional, literal, bounded and tuple fields."""

    label: Literal["a", "b"]
    weight: float = Field(gt=2.5, le=3)
    leaves: list[Leaf] = Field(min_length=2, max_length=3)
    children: list[Tree]
    parent: Tree | None
    pair: tuple[int, str]
    tags: dict[str, int]
    when: str = Field(json_schema_extra={"format": "date-time"})


@pytest.mark.parametrize("model", [Leaf, Tree])
def test_example_of_a_pydantic_schema_validates_as_that_model(model: type[BaseModel]) -> None:
    value = example(model.model_json_schema(), "hi")

    model.model_validate(value)


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "string"}, "hi"),
        ({"type": "string", "format": "email"}, "echo@example.com"),
        ({"type": ["null", "integer"], "minimum": 2}, 2),
        ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}, 1),
        ({"type": "number", "exclusiveMaximum": 0, "minimum": -1}, -0.5),
        ({"type": "boolean"}, True),
        ({"type": "null"}, None),
        ({"enum": ["x", "y"]}, "x"),
        ({"const": 7}, 7),
        ({"anyOf": [{"type": "null"}, {"type": "integer"}]}, 0),
        ({"type": "array", "items": {"type": "integer"}, "maxItems": 0}, []),
        (
            {
                "type": "array",
                "prefixItems": [{"type": "string"}, {"type": "integer"}],
                "items": False,
            },
            ["hi", 0],
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/A"}},
                "$defs": {"A": {"type": "object", "properties": {"b": {"type": "boolean"}}}},
            },
            {"a": {"b": True}},
        ),
        ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}]}, {"a": 0}),
        (True, "hi"),
    ],
)
def test_example_meets_each_kind_of_constraint(schema: Any, expected: Any) -> None:
    assert example(schema, "hi") == expected


def test_counts_and_lengths_past_what_one_value_holds_are_not_honoured() -> None:
    # A client's minItems of 30 million held the process for 15 s and answered 390 MB.
    huge = {"type": "array", "minItems": 30_000_000, "items": {"type": "string", "minLength": 9}}
    nested = {"type": "array", "minItems": 1_000, "items": huge}

    assert len(example(huge, "hi")) <= 100_000
    assert sum(len(item) for item in example(nested, "hi")) <= 100_000
    assert len(example({"type": "string", "minLength": 10**9}, "hi")) == 100_000


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "number", "minimum": 1, "multipleOf": 1e-320},  # was an OverflowError
        {"type": "integer", "minimum": 1, "multipleOf": 1e-320},
        {"type": "number", "minimum": 1e308, "exclusiveMinimum": 1.7e308},
        {"type": "integer", "maximum": -1e308, "exclusiveMaximum": -1.7e308},
        {"type": "integer", "minimum": 10**400},  # a JSON number past any float
        {"type": "number", "exclusiveMinimum": 10**400, "multipleOf": 3},
    ],
)
def test_bounds_past_what_a_float_holds_make_a_number_not_an_error(schema: Any) -> None:
    assert isinstance(example(schema, "hi"), int | float)


def test_an_all_of_that_refers_back_to_itself_stops_growing() -> None:
    # Was a RecursionError, which the gateway answered as a body nested too deeply.
    looped = {"type": "object", "properties": {"a": {"type": "integer"}}, "allOf": [{"$ref": "#"}]}

    assert example(looped, "hi") == {"a": 0}
    assert example({"allOf": [{"$ref": "#"}]}, "hi") == "hi"


def test_objects_count_their_members_against_what_one_value_holds() -> None:
    # A tree whose nodes hold three children grew 3**16 members (ran past 20 s).
    node = {"type": "object", "properties": {k: {"$ref": "#"} for k in "xyz"}}

    assert len(json.dumps(example(node, "hi"))) < 2_000_000
