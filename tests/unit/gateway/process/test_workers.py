"""``gateway.process.worker_pool``: when a dead worker is restarted (RestartBudget, on an injected
clock), and how ``--workers`` is parsed."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from typing import TYPE_CHECKING, Any

import pytest

from bus import BusClosedError, InProcessBus
from gateway.cli.main import _workers, main
from gateway.process import workers
from gateway.process.cores import usable_cores
from gateway.process.running_config import RunningConfig, text_version
from gateway.process.worker import EXIT_BUS_LOST
from gateway.process.worker_pool import RestartBudget, _ended
from schemas import ConfigChanged, subjects

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_restart_delays_double_up_to_the_ceiling() -> None:
    budget = RestartBudget(intensity=10, period=60.0, initial=0.1, ceiling=0.5, clock=_Clock())

    assert [budget.next_delay() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]


def test_restarts_past_the_intensity_within_the_period_give_up() -> None:
    clock = _Clock()
    budget = RestartBudget(intensity=3, period=60.0, clock=clock)
    for _ in range(3):
        assert budget.next_delay() is not None
        clock.now += 10.0

    assert budget.next_delay() is None


def test_restarts_older_than_the_period_are_forgiven_and_the_delay_starts_over() -> None:
    clock = _Clock()
    budget = RestartBudget(intensity=2, period=60.0, initial=0.1, clock=clock)
    budget.next_delay()
    budget.next_delay()
    clock.now = 60.0

    assert budget.next_delay() == 0.1


@pytest.mark.parametrize("bad", ["0", "-2", "many", "1.5", ""])
def test_workers_option_refuses_what_is_not_a_positive_count(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        _workers(bad)

    assert str(refused.value) == f"{bad!r}: a count of at least 1, or auto"


def test_workers_auto_is_the_cores_this_process_may_use() -> None:
    assert _workers("auto") == usable_cores() <= len(os.sched_getaffinity(0))
    assert _workers("3") == 3


def test_a_bad_workers_count_is_a_usage_error_naming_the_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["serve", "--workers", "0"])

    assert ended.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "llmgw serve: error: argument --workers: '0': a count of at least 1, or auto"
    )


@pytest.mark.parametrize(
    ("code", "said"),
    [
        (0, "exited with code 0"),
        (1, "exited with code 1"),
        (EXIT_BUS_LOST, "lost the bus"),
        (-signal.SIGKILL, "was killed by SIGKILL"),
        (None, "exited"),
    ],
)
def test_a_dead_worker_is_said_dead_by_its_exit_code(code: int | None, said: str) -> None:
    assert _ended(code) == said


class _RefusesFirstSubscription:
    """An in-process bus whose first subscription fails as one made while NATS dropped."""

    def __init__(self) -> None:
        self.bus = InProcessBus()
        self.subscribed = asyncio.Event()
        self._refused = False

    @contextlib.asynccontextmanager
    async def subscribe(self, subject: str) -> AsyncIterator[Any]:
        if not self._refused:
            self._refused = True
            raise BusClosedError(f"cannot subscribe to {subject}: TimeoutError()")
        async with self.bus.subscribe(subject) as sub:
            self.subscribed.set()
            yield sub


async def test_reloads_are_followed_after_a_subscription_the_bus_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its task ended with the refusal: a worker restarted after a reload got the run's
    # starting config.
    monkeypatch.setattr(workers, "_FOLLOW_RETRY_S", 0.01)
    path = tmp_path / "gw.yaml"
    path.write_text("models: []\n")
    running = RunningConfig(str(path))
    flaky = _RefusesFirstSubscription()
    following = asyncio.create_task(workers._follow_reloads(running, flaky))  # type: ignore[arg-type]
    try:
        async with asyncio.timeout(5):
            await flaky.subscribed.wait()
            reloaded = "models: [{id: b, route: [{kind: echo}]}]\n"
            path.write_text(reloaded)
            await flaky.bus.publish(
                subjects.event("config"), ConfigChanged(version=text_version(reloaded))
            )
            while running.text != reloaded:  # noqa: ASYNC110 (the follower has no event to await)
                await asyncio.sleep(0.01)
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)

    assert running.text == reloaded
