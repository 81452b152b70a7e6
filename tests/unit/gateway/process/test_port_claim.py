"""``gateway.process.port_claim``: one ``llmgw serve --workers`` run per port and address,
settled by the kernel (abstract Unix socket names), freed when the holder dies."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from gateway.process.port_claim import PortClaimedError, claim_port, supported

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.skipif(not supported(), reason="abstract Unix sockets are Linux's")


@pytest.fixture
def port() -> Iterator[int]:
    """A port number no other test in this network namespace claims: one held bound here."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield int(held.getsockname()[1])


def test_a_second_claim_of_a_claimed_port_is_refused_naming_the_holder(port: int) -> None:
    first = claim_port("127.0.0.1", port)
    try:
        with pytest.raises(PortClaimedError) as refused:
            claim_port("127.0.0.1", port)
    finally:
        first.release()

    assert refused.value.pid == os.getpid()
    assert str(refused.value) == (
        f"Address already in use (by another llmgw serve --workers run, supervisor pid "
        f"{os.getpid()})"
    )


def test_a_released_claim_can_be_made_again(port: int) -> None:
    claim_port("127.0.0.1", port).release()

    claim_port("127.0.0.1", port).release()


@pytest.mark.parametrize(
    ("held", "asked"),
    [
        ("127.0.0.1", "0.0.0.0"),
        ("0.0.0.0", "127.0.0.1"),
        ("::", "127.0.0.1"),
        ("127.0.0.1", "::"),
        ("::1", "::"),
        ("::ffff:127.0.0.1", "127.0.0.1"),
    ],
)
def test_a_wildcard_and_an_address_it_covers_conflict(port: int, held: str, asked: str) -> None:
    claim = claim_port(held, port)
    try:
        with pytest.raises(PortClaimedError):
            claim_port(asked, port)
    finally:
        claim.release()


@pytest.mark.parametrize(
    ("held", "asked"), [("127.0.0.1", "127.0.0.2"), ("0.0.0.0", "::1"), ("::1", "0.0.0.0")]
)
def test_addresses_whose_sockets_would_not_share_connections_both_claim(
    port: int, held: str, asked: str
) -> None:
    claim = claim_port(held, port)
    try:
        claim_port(asked, port).release()
    finally:
        claim.release()


def test_a_claim_whose_process_was_killed_is_free_at_once(port: int) -> None:
    # The kernel frees the name with the last descriptor: SIGKILL leaves nothing to clean.
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from gateway.process.port_claim import claim_port\n"
            f"claim = claim_port('127.0.0.1', {port})\n"
            "print('claimed', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "claimed\n"
        with pytest.raises(PortClaimedError) as refused:
            claim_port("127.0.0.1", port)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)

        claim_port("127.0.0.1", port).release()
    finally:
        child.kill()
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()

    assert refused.value.pid == child.pid


def test_a_second_claim_of_one_address_is_refused_by_the_kernel_alone(
    port: int, tmp_path: Path
) -> None:
    # Without the claims table (a /proc that hides it), the same address still conflicts:
    # its name is the kernel's to give once.
    hidden = tmp_path / "no-such-table"
    first = claim_port("127.0.0.1", port, table=hidden)
    try:
        with pytest.raises(PortClaimedError) as refused:
            claim_port("127.0.0.1", port, table=hidden)
    finally:
        first.release()

    assert refused.value.pid == os.getpid()
