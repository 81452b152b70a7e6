"""The steering admin commands' arguments and settings changes, as pure functions of the
SteeringActor's state: each raises InvalidRequestError naming the refused field. Also what the
configuration file gives before any admin change: the settings and the chains to start."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import msgspec

from actors.admin import text_arg
from schemas import (
    AdminCommand,
    ChainEdit,
    ChainEntry,
    ChainState,
    Guardrails,
    InvalidRequestError,
    SteeringState,
)
from schemas.catalog import (
    PROFILE_WEIGHTS,
    PROFILES,
    ascii_lower,
    chain_name_problem,
    weights_problem,
)
from schemas.keys import MAX_DURATION_S

if TYPE_CHECKING:
    from collections.abc import Collection, Container, Iterable, Mapping

    from schemas.catalog import ChainConfig, SteeringConfig

logger = logging.getLogger(__name__)


def configured_state(steering: SteeringConfig) -> SteeringState:
    """The settings the configuration's ``steering:`` gives (no chains listed yet)."""
    weights = steering.weights or PROFILE_WEIGHTS.get(steering.profile, PROFILE_WEIGHTS["balanced"])
    g = steering.guardrails
    return SteeringState(
        active_chain=steering.active_chain,
        profile=steering.profile,
        weights=weights,
        exploration=steering.exploration,
        guardrails=Guardrails(
            allowance_threshold=g.allowance_threshold,
            allowance_floor=g.allowance_floor,
            rate_limit_penalty=g.rate_limit_penalty,
            rate_limit_decay_seconds=g.rate_limit_decay_seconds,
        ),
    )


def starting_state(
    saved: SteeringState | None, saved_file: SteeringState | None, file: SteeringState
) -> SteeringState:
    """The settings to start with: the snapshot's (``saved``) when an admin command changed
    them, that is when they differ from the file's they were saved beside (``saved_file``)
    or the snapshot predates recording it; else what the file gives now (``file``), so a
    reload or a restart that changes ``steering:`` is applied to settings no admin touched."""
    if saved is None or (saved_file is not None and not admins(saved, saved_file)):
        return file
    return saved


def admins(state: SteeringState, file: SteeringState) -> bool:
    """Whether an admin command changed ``state``'s settings from the file's, ``file``."""
    return _settings(state) != _settings(file)


def lost_active(state: SteeringState, file: SteeringState, chains: Collection[str]) -> str:
    """The active chain an admin command set in ``state`` (the file's settings being
    ``file``) when it is none of ``chains`` (those that would run), else "": a reload to
    that config would leave ``auto`` on the built-in chain (the file's own ``active_chain``
    is checked against its ``chains:`` as it loads)."""
    active = state.active_chain
    return active if active and active not in chains and admins(state, file) else ""


def with_active_running(state: SteeringState, chains: Collection[str]) -> SteeringState:
    """``state`` without an active chain that does not run (``chains`` do), said loudly:
    ``auto`` then routes over the built-in chain (the whole catalogue, smartest first)."""
    if state.active_chain is None or state.active_chain in chains:
        return state
    logger.warning(
        "the active chain %r is no chain of this config (an admin command activated it): "
        "auto routes over the built-in chain until one is activated (llmgw admin chains "
        "activate --arg name=CHAIN)",
        state.active_chain,
    )
    return msgspec.structs.replace(state, active_chain=None)


def _settings(state: SteeringState) -> tuple[object, ...]:
    """What an admin command sets of the steering state (not the chains listed, not seq)."""
    return (state.active_chain, state.profile, state.weights, state.guardrails, state.exploration)


def initial_chains(
    configured: Iterable[ChainConfig], created: Mapping[str, ChainState], deleted: set[str]
) -> list[ChainState]:
    """The chains to start, configured ones first: each as an admin created it last, else as
    configured; a configured chain an admin deleted (and did not create again) is left out."""
    by_name = {c.name: c for c in configured}
    out: dict[str, ChainState] = {}
    for name in chain_names(by_name, created, deleted):
        spec = by_name.get(name)
        out[name] = created.get(name) or ChainState(
            name=name,
            org=spec.org or "" if spec else "",
            backfill=spec.backfill if spec else False,
            models=tuple(ChainEntry(model=e.model, enabled=e.enabled) for e in spec.entries())
            if spec
            else (),
        )
    return list(out.values())


def chain_names(
    configured: Iterable[str], created: Collection[str], deleted: Collection[str]
) -> list[str]:
    """The names of the chains that run, configured ones first, then the ones admins created;
    a configured chain an admin deleted (and did not create again) is left out."""
    out: list[str] = []
    for name in (*configured, *created):
        if name in out or (name in deleted and name not in created):
            continue
        out.append(name)
    return out


CHAINS_ARGS: Mapping[str, frozenset[str]] = {
    "list": frozenset({"org"}),
    "get": frozenset({"name"}),
    "create": frozenset({"name", "org", "backfill", "models"}),
    "delete": frozenset({"name"}),
    "set_models": frozenset({"name", "models"}),
    "move": frozenset({"name", "model", "position"}),
    "set_enabled": frozenset({"name", "model", "enabled"}),
    "preset": frozenset({"name", "preset"}),
    "set_backfill": frozenset({"name", "backfill"}),
    "activate": frozenset({"name"}),
}
"""The arguments each ``chains`` verb takes (any other is refused: ``orgg`` would make an
organisation's chain everyone's)."""
STEERING_ARGS: Mapping[str, frozenset[str]] = {
    "get": frozenset(),
    "set_profile": frozenset({"profile", "weights"}),
    "set_exploration": frozenset({"exploration"}),
}
"""The arguments of the ``steering`` verbs (``set_guardrails`` names its own unknown keys)."""


def new_chain_arg(cmd: AdminCommand, existing: Container[str]) -> ChainState:
    """The chain ``chains create {name, org?, backfill?, models?}`` asks for (its models not
    checked against the catalogue yet); a name in ``existing`` is refused."""
    name = ascii_lower(text_arg(cmd, "name"))
    problem = chain_name_problem(name)
    if problem:
        raise InvalidRequestError(f"'name': {problem}", param="name")
    if name in existing:
        raise InvalidRequestError(f"'name': chain {name!r} exists already", param="name")
    org = text_arg(cmd, "org", required=False)
    backfill = bool_arg(cmd, "backfill") if "backfill" in cmd.args else False
    models = entries_arg(cmd.args["models"]) if "models" in cmd.args else ()
    return ChainState(name=name, org=org, backfill=backfill, models=models)


def chain_edit_arg(verb: str, cmd: AdminCommand) -> ChainEdit:
    """The ChainEdit of ``chains <verb>`` for ``set_models`` {models}, ``move`` {model,
    position}, ``set_enabled`` {model, enabled} and ``set_backfill`` {backfill}."""
    if verb == "set_models":
        return ChainEdit(verb=verb, models=entries_arg(cmd.args.get("models")))
    if verb == "move":
        position = cmd.args.get("position")
        if isinstance(position, bool) or not isinstance(position, int):
            raise InvalidRequestError(
                "'position' must be a whole number (from 1)", param="position"
            )
        return ChainEdit(verb=verb, model=text_arg(cmd, "model"), position=position)
    if verb == "set_enabled":
        return ChainEdit(verb=verb, model=text_arg(cmd, "model"), enabled=bool_arg(cmd, "enabled"))
    if verb == "set_backfill":
        return ChainEdit(verb=verb, backfill=bool_arg(cmd, "backfill"))
    raise ValueError(f"no chain edit {verb!r}")


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
        or any(
            isinstance(w, bool) or not isinstance(w, int | float) or not 0 <= w <= 1 for w in raw
        )
    ):
        raise InvalidRequestError(
            "'weights' must be [capability, speed, reliability], each in [0, 1]", param="weights"
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
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 < value <= MAX_DURATION_S  # NaN and huge integers too
            ):
                raise InvalidRequestError(
                    f"'{key}' must be a positive number of seconds", param=key
                )
            fields[key] = float(value)
        else:
            fields[key] = fraction(value, key)
    return msgspec.structs.replace(state, guardrails=Guardrails(**fields))
