"""The steering admin commands' arguments and settings changes, as pure functions of the
SteeringActor's state: each raises InvalidRequestError naming the refused field."""

from __future__ import annotations

from typing import Any

import msgspec

from actors.admin import text_arg
from schemas import (
    AdminCommand,
    ChainEntry,
    ChainState,
    Guardrails,
    InvalidRequestError,
    SteeringState,
)
from schemas.catalog import PROFILE_WEIGHTS, PROFILES, weights_problem


def entries_arg(raw: Any, param: str = "models") -> tuple[ChainEntry, ...]:
    """Admin ``models``: a list of ids or ``{model, enabled}``. Raises InvalidRequestError."""
    if not isinstance(raw, list):
        raise InvalidRequestError(f"'{param}' must be a list of model ids", param=param)
    out = []
    for item in raw:
        if isinstance(item, str) and item:
            out.append(ChainEntry(model=item))
        elif (
            isinstance(item, dict)
            and isinstance(item.get("model"), str)
            and isinstance(item.get("enabled", True), bool)
            and set(item) <= {"model", "enabled"}
        ):
            out.append(ChainEntry(model=item["model"], enabled=item.get("enabled", True)))
        else:
            raise InvalidRequestError(
                f"'{param}' entries must be model ids or {{model, enabled}}", param=param
            )
    return tuple(out)


def bool_arg(cmd: AdminCommand, name: str) -> bool:
    value = cmd.args.get(name)
    if not isinstance(value, bool):
        raise InvalidRequestError(f"'{name}' must be true or false", param=name)
    return value


def fraction(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise InvalidRequestError(f"'{name}' must be a number in [0, 1]", param=name)
    return float(value)


def chain_view(state: ChainState) -> dict[str, Any]:
    """A chain as admin answers show it."""
    return {
        "name": state.name,
        "org": state.org or None,
        "backfill": state.backfill,
        "models": [{"model": e.model, "enabled": e.enabled} for e in state.models],
    }


def settings_view(state: SteeringState) -> dict[str, Any]:
    """The steering settings as admin answers show them."""
    g = state.guardrails
    return {
        "active_chain": state.active_chain,
        "profile": state.profile,
        "weights": list(state.weights),
        "exploration": state.exploration,
        "guardrails": msgspec.structs.asdict(g),
        "chains": list(state.chains),
    }


def with_profile(state: SteeringState, cmd: AdminCommand) -> SteeringState:
    """``state`` after ``steering set_profile {profile, weights?}``."""
    profile = text_arg(cmd, "profile")
    if profile not in PROFILES:
        raise InvalidRequestError(
            f"'profile' must be one of {', '.join(PROFILES)}", param="profile"
        )
    raw = cmd.args.get("weights")
    if profile != "custom":
        if raw is not None:
            raise InvalidRequestError(
                "'weights' are only read with profile custom", param="weights"
            )
        return msgspec.structs.replace(
            state, profile=profile, weights=PROFILE_WEIGHTS.get(profile, state.weights)
        )
    if (
        not isinstance(raw, list)
        or len(raw) != 3
        or any(isinstance(w, bool) or not isinstance(w, int | float) for w in raw)
    ):
        raise InvalidRequestError(
            "'weights' must be [capability, speed, reliability]", param="weights"
        )
    weights = (float(raw[0]), float(raw[1]), float(raw[2]))
    problem = weights_problem(weights)
    if problem:
        raise InvalidRequestError(f"'weights': {problem}", param="weights")
    return msgspec.structs.replace(state, profile=profile, weights=weights)


def with_guardrails(state: SteeringState, cmd: AdminCommand) -> SteeringState:
    """``state`` after ``steering set_guardrails {...}`` (the thresholds given change)."""
    fields = {f: getattr(state.guardrails, f) for f in Guardrails.__struct_fields__}
    for key, value in cmd.args.items():
        if key not in fields:
            raise InvalidRequestError(
                f"unknown guardrail {key!r}; known: {', '.join(fields)}", param=key
            )
        if key == "rate_limit_decay_seconds":
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise InvalidRequestError(f"'{key}' must be a positive number", param=key)
            fields[key] = float(value)
        else:
            fields[key] = fraction(value, key)
    return msgspec.structs.replace(state, guardrails=Guardrails(**fields))
