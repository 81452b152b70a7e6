"""RouteWiseSettingsActor: owns the admin's RouteWise settings (admin area ``routewise``).

Per-model overrides and the deployment fallback, persisted in its snapshot and published as
``RouteWiseSettings`` on every change, so every ModelActor applies them on its next decision;
ModelActors ask for them (``llmgw.routewise.settings.get``) when they start. Verbs:

- ``model_settings`` {model_id} (read only): each key's value and source
- ``set_model_setting`` {model_id, key, value} · ``unset_model_setting`` {model_id, key}
- ``settings`` (read only): the deployment fallback over the defaults
- ``set_settings`` {settings: {key: value, or null to remove}}

``model_id`` may be an alias: it resolves to the canonical model. A value that does not
validate for a model (with the model's other layers) is refused with InvalidRequestError.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import msgspec

from actors.admin import AdminArea, text_arg
from actors.base import Actor, ActorContext, Serve
from actors.strategies.routewise import settings as rw
from bus import Envelope, NoRespondersError, RequestTimeoutError
from schemas import (
    AdminCommand,
    InvalidRequestError,
    ModelStatus,
    RouteNotFoundError,
    RouteWiseSettings,
    RouteWiseSettingsGet,
    subjects,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.stores.snapshots import SnapshotStore
    from schemas.config import ModelConfig

logger = logging.getLogger(__name__)

_NAME = "routewise_settings"
_APPLY_TIMEOUT = 5.0


class RouteWiseSettingsActor(Actor):
    """The one owner of the RouteWise admin settings. Raises (as ErrorReply)
    RouteNotFoundError for an unknown model and InvalidRequestError for a bad key or value."""

    def __init__(
        self,
        models: tuple[ModelConfig, ...],
        default_router: str,
        *,
        snapshots: SnapshotStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = _NAME
        self._models = {m.id: m for m in models if (m.router or default_router) == "routewise"}
        self._names = {n: m.id for m in models for n in (m.id, *m.aliases)}
        self._snapshots = snapshots
        self._clock = clock
        self.admin = AdminArea(
            "routewise",
            {
                "model_settings": self._model_settings,
                "set_model_setting": self._set,
                "unset_model_setting": self._unset,
                "settings": self._fallback,
                "set_settings": self._set_fallback,
            },
            args={
                "model_settings": frozenset({"model_id"}),
                "set_model_setting": frozenset({"model_id", "key", "value"}),
                "unset_model_setting": frozenset({"model_id", "key"}),
                "settings": frozenset(),
                "set_settings": frozenset({"settings"}),
            },
        )
        self.serves = (self.admin.serve, Serve(subjects.ROUTEWISE_SETTINGS_GET))

    async def on_start(self, ctx: ActorContext) -> None:
        """Restore the settings from the snapshot (nothing set at first boot)."""
        self.ctx = ctx
        self.settings = RouteWiseSettings()
        if self._snapshots is not None:
            snap = await self._snapshots.load_as(self.name, RouteWiseSettings)
            if snap is not None:
                known = {m: v for m, v in snap.models.items() if m in self._models}
                self.settings = msgspec.structs.replace(snap, models=known)

    async def handle(self, env: Envelope) -> None:
        """Admin commands of area ``routewise`` and the ModelActors' settings requests."""
        if self.admin.owns(env):
            await self.admin.answer(self.ctx, env)
        elif isinstance(env.message, RouteWiseSettingsGet):
            await env.respond(self.settings)

    def _model(self, cmd: AdminCommand) -> ModelConfig:
        name = text_arg(cmd, "model_id")
        canonical = self._names.get(name)
        if canonical is None:
            raise RouteNotFoundError(f"no model {name!r}")
        model = self._models.get(canonical)
        if model is None:
            raise InvalidRequestError(
                f"model {canonical!r} does not use router: routewise", param="model_id"
            )
        return model

    @staticmethod
    def _key(cmd: AdminCommand) -> str:
        key = text_arg(cmd, "key")
        if key not in rw.KEYS:
            raise InvalidRequestError(
                f"unknown RouteWise setting {key!r}; known: {', '.join(rw.KEYS)}", param="key"
            )
        return key

    async def _commit(self, settings: RouteWiseSettings, models: tuple[ModelConfig, ...]) -> None:
        """Persist, then hand the settings to each affected ModelActor and wait until it has
        applied them (so the admin's answer means the next request sees them), then publish
        them for every other watcher."""
        settings = msgspec.structs.replace(settings, ts=self._clock())
        if self._snapshots is not None:
            await self._snapshots.save(
                self.name, msgspec.json.encode(settings), settings.ts, durable=True
            )
        self.settings = settings
        for model in models:
            try:
                await self.ctx.bus.request(
                    subjects.model_routewise(model.id),
                    settings,
                    reply_type=ModelStatus,
                    timeout=_APPLY_TIMEOUT,
                )
            except (NoRespondersError, RequestTimeoutError):
                # It takes the settings from this actor when it (re)starts.
                logger.warning("model %s did not confirm its RouteWise settings", model.id)
        await self.ctx.publish(subjects.ROUTEWISE_SETTINGS, settings)

    async def _model_settings(self, cmd: AdminCommand) -> dict[str, Any]:
        return rw.view(self._model(cmd), self.settings)

    async def _set(self, cmd: AdminCommand) -> dict[str, Any]:
        model, key = self._model(cmd), self._key(cmd)
        if "value" not in cmd.args:
            raise InvalidRequestError("'value' is required", param="value")
        rw.typed(key, cmd.args["value"])
        overrides = {**self.settings.models.get(model.id, {}), key: cmd.args["value"]}
        new = msgspec.structs.replace(
            self.settings, models={**self.settings.models, model.id: overrides}
        )
        rw.effective(model, new)  # raises InvalidRequestError for a bad value
        await self._commit(new, (model,))
        return rw.view(model, new)

    async def _unset(self, cmd: AdminCommand) -> dict[str, Any]:
        model, key = self._model(cmd), self._key(cmd)
        overrides = {k: v for k, v in self.settings.models.get(model.id, {}).items() if k != key}
        models = {**self.settings.models, model.id: overrides}
        if not overrides:
            del models[model.id]
        new = msgspec.structs.replace(self.settings, models=models)
        await self._commit(new, (model,))
        return rw.view(model, new)

    async def _fallback(self, cmd: AdminCommand) -> dict[str, Any]:
        return rw.fallback_view(self.settings)

    async def _set_fallback(self, cmd: AdminCommand) -> dict[str, Any]:
        changes = cmd.args.get("settings")
        if not isinstance(changes, dict):
            raise InvalidRequestError(
                "'settings' must be an object of RouteWise settings", param="settings"
            )
        fallback = dict(self.settings.fallback)
        for key, value in changes.items():
            if key not in rw.KEYS:
                raise InvalidRequestError(f"unknown RouteWise setting {key!r}", param=key)
            if value is None:
                fallback.pop(key, None)
            else:
                rw.typed(key, value)
                fallback[key] = value
        new = msgspec.structs.replace(self.settings, fallback=fallback)
        rw.validated(fallback)
        for model in self._models.values():
            rw.effective(model, new)
        await self._commit(new, tuple(self._models.values()))
        return rw.fallback_view(new)
