"""``limits set``'s arguments to a LimitSpec: a refusal names the field it is about."""

from __future__ import annotations

from typing import Any

import pytest

from schemas import InvalidRequestError
from schemas.limits import spec_arg


@pytest.mark.parametrize(
    ("args", "param"),
    [
        ({"rpm": 0}, "rpm"),
        ({"tpm": 10**13}, "tpm"),
        ({"budget_usd": -1.0}, "budget_usd"),
        ({"rpm": 5, "budget_period": "fortnight", "budget_usd": 1.0}, "budget_period"),
        ({"rpm": 5, "soft_fraction": 1.5}, "soft_fraction"),
        # Two problems: the first names the field.
        ({"concurrency": 0, "soft_fraction": 2.0}, "concurrency"),
        # Nothing limited is about no one field.
        ({"budget_period": "day"}, None),
    ],
)
def test_a_refused_spec_names_the_field_of_its_first_problem(
    args: dict[str, Any], param: str | None
) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        spec_arg(args)

    assert refused.value.param == param
    if param is not None:
        assert str(refused.value).startswith(f"'{param}' must be")


def test_a_valid_spec_is_returned() -> None:
    assert spec_arg({"rpm": 5, "budget": "10/day"}).budget_period == "day"
