"""ConfigActor: owns the configuration the actor tree runs; admin area ``config``.

``reload`` re-reads the file (through the injected ``load``, which validates it exactly as
startup does and raises InvalidRequestError with startup's message), then reconciles the
running tree with the new config's (``actors.reconfigure``): additions and replacements
first, then ``ConfigChanged`` on ``llmgw.events.config`` (every ingress re-reads its own
file and swaps its config), then removals. An invalid file, a chain that would name a model
the new config lacks (:func:`check_chains`, asked before anything changes), or a child that
fails to start leaves the running config as it was. ``show`` returns the running version and
model ids.

SIGHUP in an actors process sends the same command (``by="sighup"``).
"""

from __future__ import annotations

import json
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
    ChainEntry,
    ChainModels,
    ChainsCheck,
    ChainsChecked,
    ConfigChanged,
    GatewayError,
    InvalidRequestError,
    subjects,
)
from schemas import NoRespondersError as OwnerMissingError

if TYPE_CHECKING:
    from actors.supervisor import Supervisor
    from bus import Bus, Envelope
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


async def check_chains(bus: Bus, config: GatewayConfig, source: str = "") -> None:
    """Refuse a reload to ``config`` (read from ``source``) after which a chain would name a
    model it lacks, as startup refuses a file whose ``chains:`` do: a chain an admin command
    made or edited outlives a reload as it is. Asked of the chains' owner (the SteeringActor,
    on whichever host runs it) before the reload changes anything, by every config owner (one
    host's ConfigActor, a cluster's ClusterConfigActor). The same for the active chain an
    admin command set, when the config no longer has it (``auto`` would fall back to the
    built-in chain, where ``chains delete`` refuses to delete it). Raises
    InvalidRequestError naming the chain, the model and the command that fixes it;
    NoRespondersError (retryable) when no owner answers (it is restarting, or no cluster
    host runs it this moment); and ReloadFailedError when it answers nothing in time or
    fails."""
    try:
        reply = await bus.request(
            subjects.STEERING_CHECK,
            ChainsCheck(
                models=tuple(m.id for m in config.models),
                chains=tuple(c.name for c in config.chains),
            ),
            reply_type=ChainsChecked,
            timeout=_CHECK_TIMEOUT_S,
        )
    except NoRespondersError:
        raise OwnerMissingError(
            "reload not applied: the chains' owner (steering) is not running this moment, so "
            "whether a chain names a model this config lacks cannot be checked; nothing "
            "changed: retry"
        ) from None
    except RequestTimeoutError:
        raise ReloadFailedError(
            "reload not applied: the chains' owner did not answer in time; nothing changed"
        ) from None
    if not isinstance(reply, ChainsChecked):
        raise ReloadFailedError(f"reload not applied: the chains' owner: {reply.message}")
    if reply.gone:
        raise InvalidRequestError(_naming_gone(reply.gone, source))
    if reply.active:
        where = f"{source}: " if source else ""
        raise InvalidRequestError(
            f"{where}the active chain {reply.active!r} is no chain of this config; the running "
            "config stays (an admin command activated it, and auto routes over it: activate "
            "another first, llmgw admin chains activate --arg name=CHAIN, or none, with no name)"
        )


def _naming_gone(gone: tuple[ChainModels, ...], source: str) -> str:
    """The refusal of a reload after which chains would name models the config lacks: each
    chain and model, then the command that takes them out."""
    where = f"{source}: " if source else ""
    named = "; ".join(
        f"chain {g.chain!r} names {' and '.join(repr(m) for m in g.models)}, which "
        f"{'is no model id' if len(g.models) == 1 else 'are no model ids'} of this config"
        for g in gone
    )
    commands = " and ".join(
        f"llmgw admin chains set_models --arg name={g.chain} --arg "
        f"'models={json.dumps([_entry(e) for e in g.kept])}'"
        for g in gone
    )
    return (
        f"{where}{named}; the running config stays (a chain made or edited by an admin command "
        f"outlives a reload: take the model out of it first, {commands})"
    )


def _entry(entry: ChainEntry) -> str | dict[str, Any]:
    return entry.model if entry.enabled else {"model": entry.model, "enabled": False}


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

    async def _reload(self, cmd: AdminCommand) -> dict[str, Any]:
        st = self._state
        config, version = self._load()  # raises InvalidRequestError: nothing changed
        config, at_start = kept_at_start(st.config, config)
        await check_chains(self.ctx.bus, config, st.source)  # raises: nothing changed
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
        if at_start:
            logger.warning(
                "config reload: %s changed but %s read at start only: restart to apply",
                ", ".join(at_start),
                "is" if len(at_start) == 1 else "are",
            )
        warn_unpriced(config)
        return {
            "version": version,
            **models,
            "children": sorted(f"{c.kind} {c.label}" for c in done),
            "restart_needed": at_start,
        }


AT_START = ("database", "bus", "cluster", "telemetry")
"""The config sections read at start only: a reload keeps them as the process started."""
_RELOADED_SERVER_FIELDS = frozenset({"max_body_bytes", "max_upstream_answer_bytes"})


def kept_at_start(running: GatewayConfig, new: GatewayConfig) -> tuple[GatewayConfig, list[str]]:
    """``new`` with the sections read at start only (:data:`AT_START`) as ``running`` has
    them, and the names of those (and of ``server``'s fields but the two a reload applies)
    that ``new`` changes. A reload rebuilt the store, the keys and the limits from a changed
    ``database``: API keys made in the one the process opened answered 401."""
    changed = [name for name in AT_START if getattr(new, name) != getattr(running, name)]
    server_fields = set(type(new.server).model_fields) - _RELOADED_SERVER_FIELDS
    changed += sorted(
        f"server.{name}"
        for name in server_fields
        if getattr(new.server, name) != getattr(running.server, name)
    )
    kept = {name: getattr(running, name) for name in AT_START if name in changed}
    if any(name.startswith("server.") for name in changed):
        bounds = {name: getattr(new.server, name) for name in _RELOADED_SERVER_FIELDS}
        kept["server"] = running.server.model_copy(update=bounds)
    return (new.model_copy(update=kept) if kept else new), changed
