"""Which value of a RouteWise setting applies to a model, and where it came from.

Precedence (spec "Runtime tuning"): the admin's model override, then the model's
``router_params:``, then the admin's deployment fallback, then the default. Pure functions
of the config and a ``RouteWiseSettings``; the RouteWiseSettingsActor owns the settings.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import msgspec
from pydantic import TypeAdapter, ValidationError

from actors.strategies.routewise.params import RouteWiseParams
from schemas import InvalidRequestError, RouteWiseSettings

if TYPE_CHECKING:
    from schemas.config import ModelConfig

KEYS: tuple[str, ...] = tuple(RouteWiseParams.model_fields)
_DEFAULTS = RouteWiseParams()


def layered(model: ModelConfig, settings: RouteWiseSettings) -> dict[str, Any]:
    """The raw values in precedence order, merged (later layers win)."""
    return {**settings.fallback, **model.router_params, **settings.models.get(model.id, {})}


def effective(model: ModelConfig, settings: RouteWiseSettings) -> RouteWiseParams:
    """The params ``model`` runs with. Raises InvalidRequestError when the layers do not
    validate together (the message names the key, never its value)."""
    return validated(layered(model, settings))


def validated(values: dict[str, Any]) -> RouteWiseParams:
    """``values`` as params. Raises InvalidRequestError naming the refused key."""
    try:
        return RouteWiseParams.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise InvalidRequestError(f"{key + ': ' if key else ''}{msg}", param=key or None) from None


@functools.cache
def _field_type(key: str) -> TypeAdapter[Any]:
    annotation = RouteWiseParams.model_fields[key].annotation
    return TypeAdapter(Any if annotation is None else annotation)


def typed(key: str, value: Any) -> None:
    """Raise InvalidRequestError naming ``key`` when ``value``, as an admin sent it (JSON), is
    not of that setting's type: ``true`` or ``"0.5"`` for a number (:func:`validated` takes
    them as a config file's values, and they were stored as sent). Its bounds are
    :func:`validated`'s to check."""
    try:
        _field_type(key).validate_json(msgspec.json.encode(value), strict=True)
    except ValidationError as exc:
        msg = str(exc.errors()[0]["msg"])
        raise InvalidRequestError(f"{key}: {msg}", param=key) from None


def view(model: ModelConfig, settings: RouteWiseSettings) -> dict[str, Any]:
    """What ``GET /admin/routewise/model-settings`` answers: every key's value and source."""
    params = effective(model, settings).model_dump(mode="json")
    override = settings.models.get(model.id, {})

    def source(key: str) -> str:
        if key in override:
            return "model_override"
        if key in model.router_params:
            return "router_params"
        if key in settings.fallback:
            return "deployment_fallback"
        return "default"

    return {
        "model_id": model.id,
        "settings": {k: {"value": params[k], "source": source(k)} for k in KEYS},
        "overrides": dict(override),
    }


def fallback_view(settings: RouteWiseSettings) -> dict[str, Any]:
    """What ``GET /admin/routewise/settings`` answers: the fallback over the defaults."""
    values = {**_DEFAULTS.model_dump(mode="json"), **settings.fallback}
    return {"settings": values, "fallback": dict(settings.fallback)}
