"""Reconciling a running supervision tree with a new configuration (config reload).

``diff(old, new)`` compares two tree *descriptions* (``build_tree`` results that were never
started): the one the running tree was built from and the one of the new config. Nested
supervisors of the same name are compared child by child; a leaf child is added, removed,
or replaced when its spec differs. Specs compare by their ``functools.partial`` factory
(function, arguments — configs compare by value — restart and shutdown); a child whose
factory is not a partial is kept as it is. Children attached to the running tree at run
time (not in either description) are never touched.

``apply`` performs changes on the running tree: additions and replacements in tree order
(endpoints before the models that read them), removals in reverse. Replacement is make
before break (``Supervisor.replace_child``), so a changed model is never unanswered; an
``exclusive`` child (a capacity pool's owner) is replaced break before make, so two owners
never answer at once and the new one starts from the old one's final state. A removed child
is stopped *retired* (``Actor.request_stop``): the config no longer has it, so it may drop
what only its callers of the moment needed (a capacity pool's leases: the pool added back
later starts with none of them), unlike a restart, a replacement or a unit moving hosts,
which keep everything.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from actors.child_spec import ChildSpec

if TYPE_CHECKING:
    from collections.abc import Iterable

    from actors.supervisor import Supervisor

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Change:
    """One change to a running tree: at ``path`` (nested supervisor names below the root)."""

    kind: Literal["add", "replace", "remove"]
    path: tuple[str, ...]
    name: str
    new: ChildSpec | Supervisor | None = None
    old: ChildSpec | None = None
    index: int | None = None

    @property
    def label(self) -> str:
        """``group/child`` for logs and replies."""
        return "/".join((*self.path, self.name))


def same_spec(a: ChildSpec, b: ChildSpec) -> bool:
    """Whether two leaf specs would start the same child (see the module docstring)."""
    if (a.restart, a.shutdown, a.exclusive) != (b.restart, b.shutdown, b.exclusive):
        return False
    fa, fb = a.factory, b.factory
    if isinstance(fa, functools.partial) and isinstance(fb, functools.partial):
        return fa.func is fb.func and fa.args == fb.args and fa.keywords == fb.keywords
    return not (isinstance(fa, functools.partial) or isinstance(fb, functools.partial))


def diff(old: Supervisor, new: Supervisor, path: tuple[str, ...] = ()) -> list[Change]:
    """The changes that turn the tree described by ``old`` into the one of ``new``."""
    changes: list[Change] = []
    before = {s.name: s for s in old.specs}
    wanted = {s.name for s in new.specs}
    for i, spec in enumerate(new.specs):
        prev = before.get(spec.name)
        new_sup, old_sup = new.nested(spec.name), old.nested(spec.name)
        if prev is None:
            changes.append(Change("add", path, spec.name, new_sup or spec, index=i))
        elif new_sup is not None and old_sup is not None:
            changes += diff(old_sup, new_sup, (*path, spec.name))
        elif new_sup is not None or old_sup is not None:
            changes.append(Change("remove", path, spec.name, old=prev))
            changes.append(Change("add", path, spec.name, new_sup or spec, index=i))
        elif not same_spec(prev, spec):
            changes.append(Change("replace", path, spec.name, spec, old=prev))
    changes += [Change("remove", path, s.name, old=s) for s in old.specs if s.name not in wanted]
    return changes


def _at(root: Supervisor, path: tuple[str, ...]) -> Supervisor:
    sup = root
    for name in path:
        nested = sup.nested(name)
        if nested is None:
            raise KeyError(f"no supervisor {'/'.join(path)!r} in the running tree")
        sup = nested
    return sup


async def apply(root: Supervisor, changes: Iterable[Change], done: list[Change]) -> None:
    """Perform ``changes`` on the running tree ``root`` in the given order, appending each
    to ``done`` once done. Raises the first failure (KeyError, ValueError, a child's start
    error); the changes done before it stay done (see :func:`undo`)."""
    for c in changes:
        sup = _at(root, c.path)
        if c.kind == "add":
            assert c.new is not None
            index = None if c.index is None else min(c.index, len(sup.specs))
            await sup.add_child(c.new, index=index)
        elif c.kind == "replace":
            assert isinstance(c.new, ChildSpec)
            await sup.replace_child(c.new)
        else:
            await sup.remove_child(c.name, retire=True)
        logger.info("reload: %s %s", c.kind, c.label)
        done.append(c)


async def undo(root: Supervisor, done: list[Change]) -> None:
    """Best effort: revert additions and replacements of ``done``, latest first."""
    for c in reversed(done):
        try:
            sup = _at(root, c.path)
            if c.kind == "add":
                await sup.remove_child(c.name, retire=True)  # the config that stays lacks it
            elif c.kind == "replace" and c.old is not None:
                await sup.replace_child(c.old)
        except Exception:  # reverting is best effort; the reload already failed loudly
            logger.exception("reload: could not revert %s %s", c.kind, c.label)
