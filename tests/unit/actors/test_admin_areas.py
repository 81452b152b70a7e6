"""The admin areas the actors build against ``schemas.READ_ONLY_ADMIN_VERBS``, the one place
that says which verbs change nothing: every read-only verb there is one its area answers, and
an area audits exactly the verbs the table does not call read-only.

The areas are found in the actors' source (every ``AdminArea(...)`` call), so a new area or
verb is checked without constructing its actor."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from actors.admin import AdminArea
from bus.codec import Envelope
from schemas import READ_ONLY_ADMIN_VERBS, AdminCommand, AdminExecuted, subjects

if TYPE_CHECKING:
    from actors.base import ActorContext
    from schemas import Message

ACTORS = Path(__file__).resolve().parents[3] / "actors"


def _built_areas() -> list[tuple[str, str, frozenset[str]]]:
    """(file, area, verbs) of every ``AdminArea(area, {verb: handler, ...})`` in actors/."""
    found = []
    for path in sorted(ACTORS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "AdminArea"
            ):
                continue
            where = f"{path.relative_to(ACTORS.parent)}:{node.lineno}"
            area, verbs = [*node.args, None, None][:2]
            assert isinstance(area, ast.Constant) and isinstance(verbs, ast.Dict), (
                f"{where}: build an AdminArea from a literal area name and verb table, "
                "so that this test can read them"
            )
            keys = [k.value for k in verbs.keys if isinstance(k, ast.Constant)]
            assert len(keys) == len(verbs.keys), f"{where}: every verb must be a literal"
            found.append((where, str(area.value), frozenset(str(k) for k in keys)))
    return found


def test_the_actors_build_admin_areas() -> None:
    areas = {area for _, area, _ in _built_areas()}
    assert {"config", "log", "rules", "bench"} <= areas  # the scan sees them


@pytest.mark.parametrize("area", sorted(READ_ONLY_ADMIN_VERBS))
def test_every_read_only_verb_is_one_its_area_answers(area: str) -> None:
    built = [(where, verbs) for where, name, verbs in _built_areas() if name == area]
    assert built, f"no actor builds admin area {area!r}: drop it from READ_ONLY_ADMIN_VERBS"
    for where, verbs in built:
        unknown = sorted(READ_ONLY_ADMIN_VERBS[area] - verbs)
        assert not unknown, f"{where}: {area!r} does not answer read-only verbs {unknown}"


class _Audit:
    """An ActorContext's ``publish``, keeping what it was given."""

    def __init__(self) -> None:
        self.published: list[Message] = []

    async def publish(self, subject: str, msg: Message) -> None:
        assert subject == subjects.event("admin")
        self.published.append(msg)


async def _audited(area: str, verb: str) -> bool:
    async def handler(cmd: AdminCommand) -> dict[str, Any]:
        return {}

    audit = _Audit()
    env = Envelope(subjects.admin(area, verb), AdminCommand(by="test"), None, None)
    await AdminArea(area, {verb: handler}).answer(cast("ActorContext", audit), env)
    assert all(isinstance(m, AdminExecuted) for m in audit.published)
    return bool(audit.published)


@pytest.mark.parametrize(
    ("area", "verb", "audited"),
    [
        ("rules", "get", False),
        ("rules", "put", True),
        ("log", "flush", False),
        ("log", "prune", True),
        ("routing", "get", True),  # read-only in rules, but not a read-only verb of routing
        ("bench", "lift", True),  # an area the table does not list: every verb audited
    ],
)
async def test_an_area_audits_the_verbs_its_table_entry_does_not_call_read_only(
    area: str, verb: str, audited: bool
) -> None:
    assert await _audited(area, verb) is audited


def test_a_check_for_a_verb_the_area_does_not_answer_is_refused_when_built() -> None:
    async def get(cmd: AdminCommand) -> dict[str, Any]:
        return {}

    with pytest.raises(ValueError, match=r"checks for no verb: \['set'\]"):
        AdminArea("limits", {"get": get}, checks={"set": lambda cmd: None})
