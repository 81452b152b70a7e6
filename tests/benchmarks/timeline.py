"""Where a request's time goes at concurrency 1: the gateway's request path timed at its seams.

    python -m tests.benchmarks.timeline [--requests 6000] [--engine builtin] [--busy-poll-us 0]

A script, not a test. It starts the fast fake upstream (on ``--load-cpus``) and ``llmgw
serve`` with bench.py's config (on ``--gateway-cpus``) under a launcher that wraps the
functions in :data:`SEAMS` to note ``time.perf_counter_ns()`` as each is entered (and, for a
coroutine, left), then sends ``--requests`` plain chat requests one after another from this
process. When the gateway stops, the launcher groups its stamps into requests (each begins
where the client's bytes arrive), keeps the requests that passed the seams in the usual
order (the first fifth dropped as warm-up) and prints the median time between consecutive
seams: which step of the path (the ingress taking the request, the route decision and its
bus hop, the dispatch, the upstream's turn, what comes after the answer arrives) costs what.

A stamp costs about 0.1 µs; the wrapping adds a Python call per seam, so the steps read a
few µs long, and the total is near the unwrapped gateway's. A seam that no longer exists
fails the launcher at once: keep :data:`SEAMS` in step with the code.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import collections
import functools
import importlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gateway.process.engines import ENGINES
from schemas.process_config import ServerConfig
from tests.benchmarks.bench import (
    _GATEWAY_READY,
    Children,
    _gateway_config,
    _pinned,
    _python,
    start_fast_upstream,
)

__all__ = ["SEAMS", "main"]

SEAMS: tuple[tuple[str, str, str, str | None], ...] = (
    # (module, attribute path, tag on entry, tag on leaving: coroutines only)
    ("gateway.process.h1.connection", "Connection.data_received", "client in", None),
    ("gateway.ingress.app", "GatewayApp.__call__", "app", "app end"),
    ("gateway.ingress.pipeline", "Inference._read_json", "body", "body read"),
    ("bus.inprocess", "InProcessBus.request", "route asked", "route answered"),
    ("actors.model", "ModelActor.plan", "decision", "decided"),
    ("gateway.ingress.dispatch", "Dispatcher.call", "dispatch", "dispatched"),
    ("gateway.adapters.openai_compat", "OpenAICompatAdapter._payload", "payload", "encoded"),
    ("gateway.adapters.upstream_http", "_send", "upstream out", None),
    ("gateway.adapters.http1", "Http1Connection.data_received", "upstream in", None),
    ("gateway.ingress.settling", "Settler.answered", "settle", "settled"),
    ("gateway.http.request", "HttpRequest.respond", "respond", "responded"),
    ("gateway.process.h1.connection", "Connection.write", "client out", None),
)
_CLIENT_IN = SEAMS[0][2]
_BODY = b'{"model": "bench", "messages": [{"role": "user", "content": "hi"}]}'


def _install(stamps: list[tuple[str, int]]) -> None:
    """Wrap every seam of :data:`SEAMS` to append ``(tag, ns)`` to ``stamps``. Raises
    AttributeError for a seam the code no longer has."""
    now = time.perf_counter_ns
    for module_name, path, enter, leave in SEAMS:
        owner: Any = importlib.import_module(module_name)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        original = getattr(owner, name)
        if leave is None:

            def sync(*a: Any, _f: Any = original, _t: str = enter, **k: Any) -> Any:
                stamps.append((_t, now()))
                return _f(*a, **k)

            setattr(owner, name, functools.wraps(original)(sync))
        else:

            async def coro(
                *a: Any, _f: Any = original, _t: str = enter, _l: str = leave, **k: Any
            ) -> Any:
                stamps.append((_t, now()))
                try:
                    return await _f(*a, **k)
                finally:
                    stamps.append((_l, now()))

            setattr(owner, name, functools.wraps(original)(coro))


def table(stamps: list[tuple[str, int]]) -> list[str]:
    """The lines the launcher prints: the usual order of seams and the median µs between
    each two, over the requests that followed it."""
    requests: list[list[tuple[str, int]]] = []
    for tag, ns in stamps:
        if tag == _CLIENT_IN:
            requests.append([])
        if requests:
            requests[-1].append((tag, ns))
    requests = requests[len(requests) // 5 :]
    if not requests:
        return ["no request arrived"]
    shapes = collections.Counter(tuple(tag for tag, _ in r) for r in requests)
    shape, count = shapes.most_common(1)[0]
    usual = [r for r in requests if tuple(tag for tag, _ in r) == shape]
    lines = [
        f"{count} of {len(requests)} requests passed the seams in this order",
        "| from | to | median µs |",
        "|---|---|---:|",
    ]
    for i in range(1, len(shape)):
        gap = statistics.median((r[i][1] - r[i - 1][1]) / 1000 for r in usual)
        lines.append(f"| {shape[i - 1]} | {shape[i]} | {gap:.1f} |")
    whole = statistics.median((r[-1][1] - r[0][1]) / 1000 for r in usual)
    lines.append(f"| {shape[0]} | {shape[-1]} | **{whole:.1f}** |")
    return lines


def _launch(argv: list[str]) -> int:
    """The gateway side: ``llmgw`` with the seams stamped; the table on stderr at exit."""
    import signal

    from gateway.cli.main import main as llmgw

    stamps: list[tuple[str, int]] = []
    _install(stamps)
    atexit.register(lambda: sys.stderr.write("\n".join(["TIMELINE", *table(stamps), ""])))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # atexit runs on a clean exit
    return llmgw(argv)


async def _drive(url: str, requests: int) -> float:
    """Send ``requests`` chat requests one at a time; the client's median ms."""
    import aiohttp

    took = []
    async with aiohttp.ClientSession() as session:
        for _ in range(requests):
            start = time.perf_counter()
            async with session.post(
                f"{url}/v1/chat/completions",
                data=_BODY,
                headers={"content-type": "application/json"},
            ) as answer:
                await answer.read()
                answer.raise_for_status()
            took.append(time.perf_counter() - start)
    return statistics.median(took[len(took) // 5 :]) * 1000


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_gateway"]:
        return _launch(argv[1:])
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.timeline")
    p.add_argument("--requests", type=int, default=6000)
    p.add_argument("--engine", choices=ENGINES, default=ServerConfig().engine)
    p.add_argument("--busy-poll-us", type=int, default=0, help="server.busy_poll_us (0: off)")
    p.add_argument("--gateway-cpus", default="0")
    p.add_argument("--load-cpus", default="1")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="llmgw-timeline-") as scratch:
        tmp = Path(scratch)
        kids = Children(tmp)
        try:
            _, upstream = start_fast_upstream(kids, args.load_cpus)
            config = tmp / "gateway.yaml"
            server = f"server: {{engine: {args.engine}, busy_poll_us: {args.busy_poll_us}}}\n"
            config.write_text(_gateway_config(upstream) + server)
            serve = ["serve", "--config", str(config), "--port", "0"]
            launcher = _python("-m", "tests.benchmarks.timeline", "_gateway", *serve)
            gateway, m = kids.start(
                "gateway", _pinned(args.gateway_cpus, launcher), _GATEWAY_READY, cwd=tmp
            )
            os.sched_setaffinity(0, {int(c) for c in args.load_cpus.split(",")})
            client_ms = asyncio.run(_drive(m.group(1), args.requests))
            kids.stop(gateway)
            log = (tmp / "gateway.log").read_text(errors="replace")
        finally:
            kids.close()
    print(log[log.index("TIMELINE") + len("TIMELINE") :].strip() if "TIMELINE" in log else log)
    print(f"\nclient median: {client_ms:.3f} ms a request (engine {args.engine})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
