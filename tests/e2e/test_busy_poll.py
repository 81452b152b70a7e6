"""``server.busy_poll_us`` on every engine: the loop holds its polling window after the write to
the upstream and after each part of the answer, the gateway answers as ever, and the poller
goes with the server. Off by default. Refused out of its bounds."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import pytest
from pydantic import ValidationError

from gateway.http import busy_poll
from schemas.process_config import ServerConfig
from tests.e2e.conftest import HI, config, model, route
from tests.fixtures.gateway import start_gateway

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e


async def test_each_engine_polls_after_its_writes_and_the_poller_goes_with_the_server(
    fake_upstream: FakeUpstream, tmp_path: Path, engine: str
) -> None:
    gw = await start_gateway(
        config(model("m", route(fake_upstream)), server={"engine": engine, "busy_poll_us": 2000}),
        data_dir=tmp_path,
    )
    try:
        poller = busy_poll.pollers.get(asyncio.get_running_loop())
        assert poller is not None
        assert poller.window == pytest.approx(0.002)
        before = poller.holds
        answer = await gw.openai().chat.completions.create(model="m", messages=HI)
        assert answer.choices[0].message.content
        # One hold after the request went upstream, one after each of the answer's two parts
        # (its head, its body): without either hold point this is 2 or 1.
        assert poller.holds - before >= 3
        assert poller.spins > 0
    finally:
        await gw.stop()
    assert busy_poll.pollers.get(asyncio.get_running_loop()) is None


async def test_busy_polling_is_off_by_default(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    assert ServerConfig().busy_poll_us == 0
    gw = await start_gateway(config(model("m", route(fake_upstream))), data_dir=tmp_path)
    try:
        assert busy_poll.pollers.get(asyncio.get_running_loop()) is None
        answer = await gw.openai().chat.completions.create(model="m", messages=HI)
        assert answer.choices[0].message.content
    finally:
        await gw.stop()


async def test_another_gateway_in_the_process_leaves_a_polling_gateways_poller_alone(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A gateway started without busy polling, or with it and stopped first, must not take
    the upstream hold away from one that polls (one module-wide poller did)."""
    polled = await start_gateway(
        config(model("m", route(fake_upstream)), server={"busy_poll_us": 2000}),
        data_dir=tmp_path / "a",
    )
    try:
        poller = busy_poll.pollers.get(asyncio.get_running_loop())
        assert poller is not None
        for server in ({}, {"busy_poll_us": 500}):  # off, then on and stopped before
            other = await start_gateway(
                config(model("m", route(fake_upstream)), server=server),
                data_dir=tmp_path / f"b{len(server)}",
            )
            await other.stop()
            before = poller.holds
            answer = await polled.openai().chat.completions.create(model="m", messages=HI)
            assert answer.choices[0].message.content
            # The upstream write's hold as well as the answer's two: else 2.
            assert poller.holds - before >= 3
            assert busy_poll.pollers.get(asyncio.get_running_loop()) is poller
    finally:
        await polled.stop()
    assert busy_poll.pollers.get(asyncio.get_running_loop()) is None


@pytest.mark.parametrize("window_us", [-1, 10_001])
def test_a_window_out_of_bounds_is_a_config_error(window_us: int) -> None:
    with pytest.raises(ValidationError, match="busy_poll_us"):
        ServerConfig(busy_poll_us=window_us)


@pytest.mark.parametrize("engine_name", ["granian", "builtin"])
async def test_polling_beside_granian_is_warned_against_at_start(
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    engine_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Granian's threads wait for the GIL the polling loop holds: it only slows answers there.
    server = {"engine": engine_name, "busy_poll_us": 300}
    with caplog.at_level(logging.WARNING, logger="gateway.process.engines"):
        gw = await start_gateway(
            config(model("m", route(fake_upstream)), server=server), data_dir=tmp_path
        )
        await gw.stop()

    warned = [r.getMessage() for r in caplog.records if "busy_poll_us" in r.getMessage()]
    assert bool(warned) == (engine_name == "granian"), warned
