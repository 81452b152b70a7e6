"""``gateway.process.worker_pool``: when a dead worker is restarted (RestartBudget, on an injected
clock), and how ``--workers`` is parsed."""

from __future__ import annotations

import argparse
import os
import signal

import pytest

from gateway.cli.main import _workers, main
from gateway.process.cores import usable_cores
from gateway.process.worker import EXIT_BUS_LOST
from gateway.process.worker_pool import RestartBudget, _ended


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
