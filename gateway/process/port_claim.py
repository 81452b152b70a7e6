"""Which ``llmgw serve --workers`` run serves a port: a claim the kernel settles.

A run's workers bind with SO_REUSEPORT, which lets any socket of the same user join the port,
and the kernel then spreads connections over two gateways (two configs, two sets of limits and
circuits) with nothing said. The supervisor's check that nothing listens there yet (a bind
without SO_REUSEPORT) cannot tell a second run from the first while neither's workers listen:
two runs started at once both passed it.

So a run claims the port for its whole life with an abstract Unix socket (Linux) named after
the port and the address: the kernel gives a name to one socket at a time and frees it when
the process holding it ends, even by SIGKILL; and it lives in the network namespace, as the
port does (two containers each have their own). A second claim of the same address is
refused by the kernel itself; the claim listens, so the refused run learns the holder's pid
from a connection's peer credentials. A wildcard address covers others (``0.0.0.0`` every
IPv4 one, ``::`` every one), so claims are made one at a time under another name, the port's
mutex, held for the microseconds of one claim: the run holding it reads the claims already
made (``/proc/net/unix``; where that is hidden, only the same address conflicts) and refuses
when one covers its address or its address covers one.
Two runs on different specific addresses of one port both claim, as their sockets would not
share connections.

Elsewhere there is no abstract namespace: no claim, and two runs started at the same instant
may still share a port.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
import struct
import sys
import time
from pathlib import Path

_PREFIX = "llmgw-port"
_MUTEX_WAIT_S = 5.0  # another run holds the mutex for microseconds; this bounds a stopped one
_MUTEX_RETRY_S = 0.005
_TABLE = Path("/proc/net/unix")
_BACKLOG = 16
_ASK_TIMEOUT_S = 0.5
_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid


class PortClaimedError(Exception):
    """Another ``llmgw serve --workers`` run holds the port (``pid``: its supervisor, None
    when it could not be asked)."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        who = "" if pid is None else f", supervisor pid {pid}"
        super().__init__(f"Address already in use (by another llmgw serve --workers run{who})")


class PortClaim:
    """This run's claim on a port; :meth:`release` (or exit) gives it up."""

    def __init__(self, sock: socket.socket | None) -> None:
        self._sock = sock

    def release(self) -> None:
        """Give the port up (idempotent)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def supported() -> bool:
    """Whether claims are made here (Linux: its abstract Unix socket namespace)."""
    return sys.platform.startswith("linux")


def claim_port(address: str, port: int, *, table: Path = _TABLE) -> PortClaim:
    """Claim ``port`` on ``address`` (an IP address, as bound) for this process.

    Raises PortClaimedError when another run's claim covers it, OSError when the claim cannot
    be made (the mutex stayed taken for seconds)."""
    if not supported():
        return PortClaim(None)
    ours = _normal(address)
    mutex = _take_mutex(port)
    try:
        for other in _claims(port, table):
            if other != ours and _overlap(ours, other):
                raise PortClaimedError(_holder(_name(port, other)))
        try:
            sock = _bind(_name(port, ours))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise PortClaimedError(_holder(_name(port, ours))) from None
        sock.listen(_BACKLOG)  # never accepted: a refused run only reads who holds it
    finally:
        mutex.close()
    return PortClaim(sock)


def _name(port: int, address: str) -> str:
    return f"{_PREFIX}/{port}/{address}"


def _take_mutex(port: int) -> socket.socket:
    deadline = time.monotonic() + _MUTEX_WAIT_S
    while True:
        try:
            return _bind(f"{_PREFIX}/{port}")
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                raise
        time.sleep(_MUTEX_RETRY_S)  # start-up, before the event loop serves anything


def _bind(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(b"\0" + name.encode())
    except OSError:
        sock.close()
        raise
    return sock


def _holder(name: str) -> int | None:
    """The pid of the process holding the claim ``name`` (its peer credentials), or None."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(_ASK_TIMEOUT_S)  # a full backlog: connect would wait
        try:
            probe.connect(b"\0" + name.encode())
            creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
        except OSError:
            return None
    pid, _uid, _gid = _CREDS.unpack(creds)
    return int(pid)


def _claims(port: int, table: Path) -> list[str]:
    """The addresses of every claim on ``port`` in this network namespace."""
    head = f"@{_name(port, '')}"
    found: list[str] = []
    with contextlib.suppress(OSError), table.open() as rows:
        for row in rows:
            fields = row.split()
            if len(fields) >= 8 and fields[7].startswith(head):
                found.append(fields[7][len(head) :])
    return found


def _normal(address: str) -> str:
    """``address`` as one spelling: an IPv4-mapped IPv6 address as the IPv4 one."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def _overlap(one: str, other: str) -> bool:
    """Whether sockets on the two addresses would take each other's connections: the same
    address, or a wildcard and an address it covers (``0.0.0.0`` every IPv4 one, ``::``
    every one: IPv4 too, unless IPV6_V6ONLY)."""
    return one == other or _covers(one, other) or _covers(other, one)


def _covers(wildcard: str, address: str) -> bool:
    return wildcard == "::" or (wildcard == "0.0.0.0" and ":" not in address)
