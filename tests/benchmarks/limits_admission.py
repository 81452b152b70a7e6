"""What a limit costs one request, in-process: the ingress's Admission and the LimitsActor on
the in-process bus, N requests with C in flight, each begin -> (routing) -> decide -> finish.

Prints the CPU per request with a limit on the caller's key and without (the caller then
has no limits: the ingress asks nothing), alternated so the machine's drift hits both, and
their difference: the limit's cost (the ingress's side and the owner's counting together).
The end-to-end rows (``--limit`` against ``--key``) include it; this isolates it from the
HTTP and upstream noise around it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from actors.limits import LimitsActor
from bus import InProcessBus
from gateway.auth.gate import Caller
from gateway.ingress.admission import Admission
from schemas import AdminCommand, AdminReply, subjects
from schemas.config import GatewayConfig
from schemas.limits import LimitsConfig

_CALLER = Caller(key_hash="h", role="pro", key_id="k-bench", org="bench", user="bench")
_GENEROUS = {
    "kind": "key",
    "id": "k-bench",
    "rpm": 10**9,
    "tpm": 10**12,
    "concurrency": 10**6,
    "budget": f"{10**9}/month",
}


class _Req:
    extra_headers: list[tuple[bytes, bytes]] | None = None


async def _cpu_per_request(n: int, in_flight: int, *, limited: bool) -> float:
    bus = InProcessBus()
    with tempfile.TemporaryDirectory() as tmp:
        actor = LimitsActor(str(Path(tmp) / "limits.db"), LimitsConfig())
        async with anyio.create_task_group() as tg:
            await tg.start(actor.run, bus)
            if limited:
                await bus.request(
                    subjects.admin("limits", "set"),
                    AdminCommand(args=_GENEROUS, by="bench"),
                    reply_type=AdminReply,
                    timeout=5.0,
                )
            admission = Admission(bus, GatewayConfig.model_validate({"models": []}))
            await admission.start()
            gate = asyncio.Semaphore(in_flight)

            async def one(i: int) -> None:
                async with gate:
                    ticket = admission.begin(
                        _Req(),  # type: ignore[arg-type]
                        _CALLER,
                        f"r{i}",
                        None,
                        {"max_tokens": 16},
                        20,
                    )
                    await asyncio.sleep(0)  # the routing request runs meanwhile
                    if ticket is not None:
                        await ticket.decide()
                        await ticket.finish()

            await asyncio.gather(*(one(i) for i in range(n // 10)))  # warm-up
            started = time.process_time()
            await asyncio.gather(*(one(i) for i in range(n // 10, n // 10 + n)))
            spent = time.process_time() - started
            await admission.aclose()
            actor.request_stop()
    await bus.aclose()
    return spent / n * 1e6


def main(argv: list[str]) -> int:
    """Print the table."""
    p = argparse.ArgumentParser(prog="bench admission")
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    without: list[float] = []
    with_limit: list[float] = []
    for _ in range(args.repeat):
        for limited, out in ((False, without), (True, with_limit)):
            out.append(
                asyncio.run(_cpu_per_request(args.requests, args.concurrency, limited=limited))
            )
    a, b = statistics.median(without), statistics.median(with_limit)
    print("| in flight | no limit µs/req | limit µs/req | the limit's cost µs/req |")
    print("|---:|---:|---:|---:|")
    print(f"| {args.concurrency} | {a:.1f} | {b:.1f} | {b - a:.1f} |")
    return 0
