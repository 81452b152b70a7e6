"""The operator side of a gateway process, wired by ``gateway.process.serve`` (the actors' side,
the events stream and the ConfigActor, is ``gateway.process.actor_host``; nothing here imports
``actors``).

- :func:`start_ingress_ops` (processes serving HTTP): the app's background operations —
  following ``ConfigChanged`` and counting operator events.
- :func:`sighup_handler`: SIGHUP reloads the config through its owner (the ConfigActor, or a
  cluster's ClusterConfigActor), whichever process takes it: an ingress too, which then
  serves what the actors applied, never its own reading of its file.

Both sides load the config file with :func:`load_versioned`: the same validation, and the same
message for a broken file, as at startup (the ConfigActor's side also validates routers with
the strategies; an ingress checks their shape only).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.admin.http import admin_request
from gateway.process.config import DEMO_CONFIG, ConfigError, RouterCheck, load_config
from gateway.process.reload import ConfigFollower
from gateway.process.running_config import text_version
from schemas import GatewayError, InvalidRequestError

if TYPE_CHECKING:
    from collections.abc import Callable

    from bus import Bus
    from gateway.ingress.app import GatewayApp
    from schemas.config import GatewayConfig

logger = logging.getLogger(__name__)

_RELOAD_TIMEOUT_S = 30.0


def config_version(path: str | None) -> str:
    """A short hash of the config file's text ("" when it cannot be read)."""
    try:
        if path is None:
            text = resources.files("gateway").joinpath(DEMO_CONFIG).read_text()
        else:
            text = Path(path).read_text()
    except OSError:
        return ""
    return text_version(text)


def load_versioned(
    path: str | None, *, routers: RouterCheck | None = None
) -> tuple[GatewayConfig, str]:
    """The validated config at ``path`` (``routers``: as ``load_config``) and its version.

    Raises InvalidRequestError carrying startup's ConfigError message.
    """
    try:
        config = load_config(path, routers=routers)
    except ConfigError as exc:
        raise InvalidRequestError(str(exc)) from None
    return config, config_version(path)


def start_ingress_ops(
    bus: Bus, app: GatewayApp, config_path: str | None, version: str | None = None
) -> asyncio.Task[None]:
    """Run the app's background operations in a task (cancel it to stop). ``version``: that
    of the config text the app serves (None: the file's now). Until :func:`report_ops`, its
    failure is its starter's to report (a start-up that cannot subscribe fails whole)."""
    if version is None:
        version = config_version(config_path)
    follower = ConfigFollower(app, functools.partial(load_versioned, config_path), version)
    return asyncio.create_task(app.ops.run(follower), name="llmgw:ingress-ops")


def report_ops(task: asyncio.Task[None]) -> None:
    """Log the ingress operations' failure, should ``task`` (:func:`start_ingress_ops`) end
    with one from now on."""
    task.add_done_callback(_report)


async def stop_ops(task: asyncio.Task[None]) -> None:
    """Stop the ingress operations (:func:`start_ingress_ops`) and wait until they have
    ended; a failure then (the bus closing under them) is not one to report."""
    task.remove_done_callback(_report)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def _report(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error(
            "ingress operations stopped (config changes are no longer followed): %r",
            task.exception(),
        )


def install_sighup(callback: Callable[[], None]) -> None:
    """Call ``callback`` on SIGHUP (where the platform has it)."""
    with contextlib.suppress(NotImplementedError, AttributeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, callback)


def sighup_handler(bus: Bus) -> Callable[[], None]:
    """The SIGHUP callback: ``config reload`` sent to the config's owner over ``bus``, its
    outcome logged here (the operator signalled this process). An ingress sends it too: it
    re-read its own file, so a reload the actors refused left it serving the refused file (a
    model they still ran answered 404 there), and one they never ran (SIGHUP to the ingress
    alone) changed it alone; it follows the ConfigChanged of what they applied, as every
    ingress and worker does."""
    pending: set[asyncio.Task[None]] = set()

    async def reload() -> None:
        try:
            result = await admin_request(
                bus, "config", "reload", by="sighup", timeout=_RELOAD_TIMEOUT_S
            )
        except GatewayError as err:
            # The one line of it (the owner's audit leaves a SIGHUP's outcome to this one).
            logger.error("SIGHUP: config reload refused: %s", err.message)
            return
        host = f" (by host {result['node_id']})" if result.get("node_id") else ""
        logger.info("SIGHUP: config reloaded: version %s%s", result.get("version"), host)

    def on_signal() -> None:
        task = asyncio.get_running_loop().create_task(reload())
        pending.add(task)
        task.add_done_callback(pending.discard)

    return on_signal
