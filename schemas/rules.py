"""The routing rule set on the bus and on disk: what the RulesActor owns and publishes.

A rule is ``{name, when, route}``: ``when`` is a condition in the JSON query form of
``schemas.rule_language`` over ``params.*`` and ``metadata.*``, ``route`` is ``auto:<chain>``
or ``auto:<axis>``. The set is ordered; the first rule that matches routes a request that
said ``model: "auto"``. The structs carry the set as written (``when`` stays plain JSON), so
what is stored, published and answered is exactly what the operator put; every reader
compiles it with ``rule_language.compile_rules``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

# The closed ``params.*`` namespace: what the ingress derives from the request it serves.
PARAMS: tuple[str, ...] = (
    "surface",  # chat | responses | messages | embeddings
    "stream",  # bool
    "prompt_tokens",  # int, the estimate the context-window check uses
    "max_tokens",  # int, absent when the request sets none
    "has_tools",  # bool
    "has_images",  # bool
    "modalities",  # list of str: "text" plus image/audio/file when the request carries them
    "temperature",  # number, absent when the request sets none
    "message_count",  # int (0 for embeddings)
    "role",  # the caller's role (free ... admin)
)

# Bounds, so a stored rule cannot cost an unbounded walk per request.
MAX_RULES = 100
MAX_DEPTH = 8  # levels of $and/$or, the rule's top level being 1
MAX_CLAUSES = 64  # leaf comparisons per rule
MAX_REGEX_CHARS = 128
MAX_IN_VALUES = 256  # values in one $in/$nin list
MAX_NAME_CHARS = 64
# What one request may cost: the whole set's matching work (``schemas.rule_cost``), each
# $regex's compiled size, and the longest string a comparison can be handed (a client label;
# every ``params.*`` string is shorter).
MAX_RULE_SET_UNITS = 300_000
MAX_REGEX_PROGRAM = 192  # RE2 instructions (``programsize``) of one $regex
MAX_LABEL_BYTES = 128  # UTF-8 bytes of one string label in ``x-llmgw-metadata``


class Rule(msgspec.Struct, frozen=True, kw_only=True):
    """One rule as written: a name (unique in the set), a condition and a route."""

    name: str
    when: dict[str, Any]
    route: str


class RulesGet(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask the RulesActor for the current set (reply: RulesState)."""


class RulesState(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The rule set as its owner holds it; published on ``llmgw.rules.state`` on every change.

    ``status`` is ``disabled`` when the stored set could not be read (``reason`` says why):
    routing then goes on without rules until a valid set is put. ``version`` counts changes,
    so a reader keeps the newest of two states that arrive out of order.
    """

    rules: tuple[Rule, ...] = ()
    status: Literal["ok", "disabled"] = "ok"
    reason: str = ""
    version: int = 0
    updated: float = 0.0


class StoredRules(msgspec.Struct, frozen=True, kw_only=True):
    """The RulesActor's snapshot: the set and its version."""

    rules: tuple[Rule, ...] = ()
    version: int = 0
    updated: float = 0.0
