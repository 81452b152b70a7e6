"""Which verbs of each admin area change nothing: the one table both sides read.

An area's owner (``actors.admin.AdminArea``) audits every verb but these; the CLI sends one of
them again when it timed out, and says the outcome of any other is unknown. A verb is read-only
only in the areas listed here (``get`` of one area says nothing about ``get`` of another), and
an area absent from the table has no read-only verb.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

READ_ONLY_ADMIN_VERBS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "api_keys": frozenset({"list"}),
        "bench": frozenset(),
        "chains": frozenset({"get", "list"}),
        "cluster": frozenset({"members"}),
        "config": frozenset({"show"}),
        "limits": frozenset({"get", "usage"}),
        # ``flush`` commits rows already sent to the log: running it again is harmless.
        "log": frozenset({"aggregate", "flush", "query", "stats"}),
        "provider_keys": frozenset({"list"}),
        "routewise": frozenset({"model_settings", "settings"}),
        "routing": frozenset({"weights"}),
        "rules": frozenset({"get", "validate"}),
        "spend": frozenset({"report"}),
        "steering": frozenset({"get"}),
    }
)
"""Admin area -> the verbs of it that change nothing."""


def is_admin_change(area: str, verb: str) -> bool:
    """True when ``verb`` of a known admin ``area`` (one in :data:`READ_ONLY_ADMIN_VERBS`)
    changes state; False for a read-only verb and for an area no table row names."""
    return area in READ_ONLY_ADMIN_VERBS and verb not in READ_ONLY_ADMIN_VERBS[area]


def is_read_only_admin_verb(area: str, verb: str) -> bool:
    """True when ``verb`` of admin ``area`` changes nothing (see :data:`READ_ONLY_ADMIN_VERBS`)."""
    return verb in READ_ONLY_ADMIN_VERBS.get(area, frozenset())
