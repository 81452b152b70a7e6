"""ConfigActor: owns the configuration the actor tree runs; admin area ``config``.

``reload`` re-reads the file (through the injected ``load``, which validates it exactly as
startup does and raises InvalidRequestError with startup's message), then reconciles the
running tree with the new config's (``actors.reconfigure``): additions and replacements
first, then ``ConfigChanged`` on ``llmgw.events.config`` (every ingress re-reads its own
file and swaps its config), then removals. An invalid file, a child that fails to start, or
a chain that would name a model the new config lacks (a chain an admin made outlives the
reload; startup refuses a config whose chains name an unknown model) leaves the running
config as it was. ``show`` returns the running version and model ids.

SIGHUP in an actors process sends the same command (``by="sighup"``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from actors.admin import AdminArea
from actors.base import Actor, ActorContext
from actors.reconfigure import Change, apply, diff, undo
from bus import NoRespondersError, RequestTimeoutError
from schemas import (
    AdminCommand,
    ConfigChanged,
    GatewayError,
    InvalidRequestError,
    SteeringGet,
    SteeringSnapshot,
    subjects,
)

if TYPE_CHECKING:
    from actors.supervisor import Supervisor
    from bus import Envelope
    from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)

Loader = Callable[[], "tuple[GatewayConfig, str]"]
_CHECK_TIMEOUT_S = 10.0


@dataclass(slots=True)
class ConfigState:
    """The running config, its version and the tree description built from it.

    Shared by every incarnation of the ConfigActor, so a restarted one diffs against what
    the tree really runs, not against the startup config.
    """

    config: GatewayConfig
    version: str
    tree: Supervisor
    source: str = ""


class ReloadFailedError(GatewayError):
    """The new config was valid but applying it to the tree failed; the old one still runs."""


def model_changes(old: GatewayConfig, new: GatewayConfig) -> dict[str, list[str]]:
    """Public model ids added, changed and removed between two configs."""
    before = {m.id: m for m in old.models}
    after = {m.id: m for m in new.models}
    return {
        "added": [m for m in after if m not in before],
        "changed": [m for m in after if m in before and after[m] != before[m]],
        "removed": [m for m in before if m not in after],
    }


def warn_unpriced(config: GatewayConfig) -> None:
    """Log the routes of ``config`` with no ``pricing:``, once per config put to work (at
    startup, and by a reload once applied: never for one refused, nor again for one a host
    already runs): the budgets are set at run time (keys, admin), so any of them may be
    spent through these routes without limit."""
    unpriced = config.unpriced_endpoints()
    if unpriced:
        logger.warning(
            "%d route(s) have no pricing: and are billed $0, so no budget counts their requests"
            " (llmgw_unpriced_attempts_total counts their use; declare pricing: {prompt: 0,"
            " completion: 0} for a route that is free): %s",
            len(unpriced),
            ", ".join(unpriced),
        )


class ConfigActor(Actor):
    """Answers ``llmgw.admin.config.{reload,show}``. Raises (as ErrorReply)
    InvalidRequestError for an invalid file, ReloadFailedError when applying failed."""

    def __init__(
        self,
        root: Supervisor,
        state: ConfigState,
        *,
        load: Loader,
        build: Callable[[GatewayConfig], Supervisor],
    ) -> None:
        self.name = "config"
        self._root = root
        self._state = state
        self._load = load
        self._build = build
        self.admin = AdminArea(
            "config",
            {"reload": self._reload, "show": self._show},
            args={"reload": frozenset(), "show": frozenset()},
        )
        self.serves = (self.admin.serve,)

    async def on_start(self, ctx: ActorContext) -> None:
        """Nothing to build: the state lives in the shared ConfigState."""
        self.ctx = ctx

    async def handle(self, env: Envelope) -> None:
        """Admin commands of area ``config``."""
        if self.admin.owns(env):
            await self.admin.answer(self.ctx, env)

    async def _show(self, cmd: AdminCommand) -> dict[str, Any]:
        st = self._state
        return {
            "version": st.version,
            "source": st.source,
            "models": [m.id for m in st.config.models],
        }

    async def _check_chains(self, config: GatewayConfig) -> None:
        """Refuse (InvalidRequestError) a reload after which a chain would name a model the
        config lacks, as startup refuses a config whose chains do: a chain an admin made or
        edited, or one backfill grew, outlives the reload (its owner's snapshot) and kept the
        model. Asked of the steering actor the reload just started, so what is checked is
        what would run. Raises ReloadFailedError when it cannot be asked."""
        try:
            reply = await self.ctx.bus.request(
                subjects.STEERING_GET,
                SteeringGet(),
                reply_type=SteeringSnapshot,
                timeout=_CHECK_TIMEOUT_S,
            )
        except NoRespondersError:
            return  # no steering in this tree: no chain to check
        except RequestTimeoutError:
            raise ReloadFailedError(
                "reload not applied: the chains' owner did not answer in time"
            ) from None
        if not isinstance(reply, SteeringSnapshot):
            raise ReloadFailedError(f"reload not applied: the chains' owner: {reply.message}")
        ids = {m.id for m in config.models}
        where = f"{self._state.source}: " if self._state.source else ""
        for chain in sorted(reply.chains, key=lambda c: c.name):
            for entry in chain.models:
                if entry.model not in ids:
                    raise InvalidRequestError(
                        f"{where}chain {chain.name!r} names {entry.model!r}, which is no model "
                        "id of this config; the running config stays (a chain made or edited "
                        "by an admin command outlives a reload: take the model out of it "
                        "first, llmgw admin chains set_models)"
                    )

    async def _reload(self, cmd: AdminCommand) -> dict[str, Any]:
        st = self._state
        config, version = self._load()  # raises InvalidRequestError: nothing changed
        tree = self._build(config)
        changes = diff(st.tree, tree)
        early = [c for c in changes if c.kind != "remove"]
        removals = [c for c in reversed(changes) if c.kind == "remove"]
        done: list[Change] = []
        try:
            await apply(self._root, early, done)
        except Exception as exc:  # a child failed to start: put the tree back as it was
            await undo(self._root, done)
            raise ReloadFailedError(f"reload not applied: {type(exc).__name__}: {exc}") from exc
        try:
            await self._check_chains(config)
        except GatewayError:  # before any ingress was told: only the tree goes back
            await undo(self._root, done)
            raise
        models = model_changes(st.config, config)
        await self.ctx.publish(
            subjects.event("config"),
            ConfigChanged(
                version=version,
                source=st.source,
                added=tuple(models["added"]),
                changed=tuple(models["changed"]),
                removed=tuple(models["removed"]),
                by=cmd.by,
                ts=time.time(),
            ),
        )
        try:
            await apply(self._root, removals, done)
        finally:
            st.config, st.version, st.tree = config, version, tree
        logger.info("config reloaded (version %s): %s", version, models)
        warn_unpriced(config)
        return {
            "version": version,
            **models,
            "children": sorted(f"{c.kind} {c.label}" for c in done),
        }
