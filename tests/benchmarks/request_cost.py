"""What one request costs the gateway's own process, measured in instructions or CPU time.

    python -m tests.benchmarks.request_cost [--modes plain,stream,fixed-5,routewise-5]
        [--requests 2000] [--concurrency 1] [--telemetry] [--no-request-log]
    python -m tests.benchmarks.request_cost --callgrind [--requests 300] [--out-dir DIR]

Runs, in one process, the actor tree and the ingress's ASGI app (``create_app``) on the
in-process bus and uvloop (``--loop asyncio``: asyncio's own), as ``llmgw serve`` does, and
drives the app's ASGI callable with a fake receive/send (no HTTP server, no client
sockets); the upstream is the benchmark's fast fake upstream (``tests.fixtures.upstream
--mode fast``) in a child process on loopback, reached through the gateway's real HTTP
client. The modes are those of ``bench.py``: chat to a model
of one route, plain and streamed, and plain chat to a model of five priced routes under the
``fixed`` draw and under ``routewise``. Each mode is warmed up first.

Without ``--callgrind`` it prints, per mode, the CPU microseconds per request on the calling
thread's clock and on the process's (a busy machine inflates both less than wall time).
With ``--callgrind`` it runs itself again under ``valgrind --tool=callgrind`` and prints the
instructions per request, which do not depend on what else the machine runs: each mode's
measured requests are one callgrind dump (``DIR/callgrind.out.<mode>``, less an empty
window's cost), to read with ``callgrind_annotate --inclusive=yes``. The HTTP server's own
share (Hypercorn's or granian's framing) is not in these figures; ``bench.py`` measures that.

``--telemetry`` runs the same requests with ``telemetry: {enabled: true}`` exporting to a
local OTLP sink (``tests.fixtures.otlp --sink`` in a child process); each mode's measured
window then ends with a flush of the queued spans, so the export thread's share of exactly
those requests is in the figure. The difference from a run without it is what the request
path and the export cost only because telemetry is on.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, MutableMapping

MODES = ("plain", "stream", "fixed-5", "routewise-5")
_MODELS = {"plain": "bench", "stream": "bench", "fixed-5": "bench-fixed-5"}
_MODELS["routewise-5"] = "bench-routewise-5"
_UPSTREAM_MODEL = "bench-upstream"
_PROMPT = [{"role": "user", "content": "Say hello in three words."}]
_WARMUP = 50
_ENV_WINDOW = "LLMGW_REQUEST_COST_CALLGRIND"  # set in the run under valgrind: dump per mode


def _config(
    upstream_url: str, database: str, telemetry: bool = False, request_log: bool = True
) -> dict[str, Any]:
    def route(i: int, priced: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "openai_compat",
            "base_url": f"{upstream_url}/v1",
            "provider_model_id": _UPSTREAM_MODEL,
            "api_key": "sk-bench",
        }
        if priced:
            out["pricing"] = {"prompt": 0.1 * (i + 1), "completion": 0.4 * (i + 1)}
        return out

    models: list[dict[str, Any]] = [{"id": "bench", "route": [route(0, False)]}]
    for router in ("fixed", "routewise"):
        routes = [route(i, True) for i in range(5)]
        models.append({"id": f"bench-{router}-5", "router": router, "route": routes})
    out: dict[str, Any] = {"models": models, "database": {"path": database}}
    if telemetry:
        out["telemetry"] = {"enabled": True}
    if not request_log:
        out["log"] = {"enabled": False}
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], what: str = "fake upstream") -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {what} did not start") from None
            time.sleep(0.05)  # a child process's listen: no event to await


@dataclass(frozen=True)
class _Exchange:
    """One request's ASGI scope and body, built once per mode and reused."""

    scope: dict[str, Any]
    body: bytes
    stream: bool


def _exchange(mode: str) -> _Exchange:
    from gateway.replay.requests import chat_scope  # as the ingress's replay drives it

    stream = mode == "stream"
    body = json.dumps({"model": _MODELS[mode], "messages": _PROMPT, "stream": stream}).encode()
    headers = [
        (b"host", b"127.0.0.1:8080"),
        (b"user-agent", b"request-cost/1"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    scope = chat_scope(headers, ("127.0.0.1", 50000))
    return _Exchange(scope, body, stream)


async def _one(
    app: Callable[[Any, Any, Any], Awaitable[None]], ex: _Exchange, never: asyncio.Future[Any]
) -> None:
    """One exchange through the ASGI callable, as a server would drive it; checks the answer."""
    sent_body = False
    status = 0
    parts: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": ex.body, "more_body": False}
        await never  # the client stays connected
        raise AssertionError("unreachable")

    async def send(msg: MutableMapping[str, Any]) -> None:
        nonlocal status
        if msg["type"] == "http.response.start":
            status = msg["status"]
        else:
            parts.append(msg.get("body", b""))

    await app(dict(ex.scope), receive, send)
    answer = b"".join(parts)
    done = b"data: [DONE]" if ex.stream else b'"choices"'
    if status != 200 or done not in answer:
        raise RuntimeError(f"bad answer {status}: {answer[:300]!r}")


async def _run(
    app: Callable[[Any, Any, Any], Awaitable[None]], ex: _Exchange, n: int, concurrency: int
) -> None:
    never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await _one(app, ex, never)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def _callgrind(command: str, label: str = "") -> None:
    args = ["callgrind_control", command, *([label] if label else []), str(os.getpid())]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def _measure(upstream_url: str, args: argparse.Namespace, database: str) -> int:
    from bus import open_bus
    from gateway.ingress.app import create_app
    from gateway.process.actor_host import ActorHost
    from gateway.process.config import parse_config
    from gateway.process.serve import declare_asyncio, settle_gc

    declare_asyncio()  # as serve does, before the first task starts
    raw = _config(upstream_url, database, args.telemetry, not args.no_request_log)
    config = parse_config(json.dumps(raw), source="<request_cost>")
    bus = await open_bus("inproc://")
    host = await ActorHost.start(bus, config, None)
    app = create_app(bus, config)
    lifespan: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    started = asyncio.Event()

    async def life_send(msg: MutableMapping[str, Any]) -> None:
        if msg["type"] == "lifespan.startup.complete":
            started.set()

    await lifespan.put({"type": "lifespan.startup"})
    life = asyncio.create_task(app({"type": "lifespan"}, lifespan.get, life_send))
    await started.wait()
    windowed = os.environ.get(_ENV_WINDOW) == "1"
    telemetry = app.ops.telemetry

    def flush() -> None:  # the spans of the requests so far, exported now (blocking)
        if telemetry is not None:
            telemetry._tracer_provider.force_flush()

    try:
        settle_gc()
        if windowed:  # what zeroing and dumping cost by themselves, subtracted per mode
            _callgrind("-z")
            _callgrind("-d", "empty")
        for mode in args.modes:
            ex = _exchange(mode)
            await _run(app, ex, _WARMUP, args.concurrency)
            flush()
            if windowed:
                _callgrind("-z")
            profiler = cProfile.Profile() if args.profile else None
            thread0, process0 = time.thread_time(), time.process_time()
            if profiler is not None:
                profiler.enable()
            await _run(app, ex, args.requests, args.concurrency)
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(f"{args.profile}.{mode}")
            thread1 = time.thread_time()
            flush()
            process1 = time.process_time()
            if windowed:
                _callgrind("-d", mode)
            n = args.requests
            print(
                f"{mode:12} c={args.concurrency:<3} thread {1e6 * (thread1 - thread0) / n:8.1f} µs"
                f"  process {1e6 * (process1 - process0) / n:8.1f} µs per request",
                flush=True,
            )
    finally:
        await lifespan.put({"type": "lifespan.shutdown"})
        await life
        await host.aclose()
        await bus.aclose()
    return 0


def _summary(path: str) -> tuple[str, int]:
    """(the dump's trigger label, its instruction total)."""
    label, total = "", 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("desc: Trigger:"):
                label = line.rsplit(" ", 1)[-1].strip()
            elif line.startswith("summary:"):
                total = int(line.split()[1])
    return label, total


def _under_callgrind(argv: list[str], args: argparse.Namespace) -> int:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--callgrind needs valgrind (callgrind_control) on PATH")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / "callgrind.out.request_cost"
    for old in glob.glob(f"{stem}*"):
        os.unlink(old)
    child_argv = [a for a in argv if a != "--callgrind"]
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={stem}",
        sys.executable,
        "-m",
        "tests.benchmarks.request_cost",
        *child_argv,
    ]
    done = subprocess.run(cmd, env={**os.environ, _ENV_WINDOW: "1"}, check=False)
    if done.returncode != 0:
        return done.returncode
    dumps = dict(_summary(p) for p in glob.glob(f"{stem}.*"))
    empty = dumps.pop("empty", 0)
    for path in glob.glob(f"{stem}.*"):
        label, _ = _summary(path)
        if label in args.modes:
            os.replace(path, out_dir / f"callgrind.out.{label}")
    for mode in args.modes:
        per = (dumps[mode] - empty) / args.requests
        print(f"{mode:12} c={args.concurrency:<3} {per:12,.0f} instructions per request")
    print(f"(dumps in {out_dir}; callgrind_annotate --inclusive=yes {out_dir}/callgrind.out.MODE)")
    return 0


def _modes(text: str) -> list[str]:
    modes = [m for m in re.split(r"[,\s]+", text) if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown modes {unknown}; known: {', '.join(MODES)}")
    return modes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--modes", type=_modes, default=list(MODES))
    parser.add_argument(
        "--requests", type=int, default=None, help="per mode (2000; 300 with --callgrind)"
    )
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="event loop (default uvloop, as llmgw serve)",
    )
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument(
        "--telemetry",
        action="store_true",
        help="telemetry on, exporting to a local OTLP sink (each window ends with a flush)",
    )
    parser.add_argument(
        "--no-request-log",
        action="store_true",
        help="log.enabled: false (under valgrind the store's timed commits and resends move "
        "each figure by up to about 4 %%; without them, a path's cut can be read)",
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="cProfile each mode's measured "
        "requests into FILE.MODE (the Python functions callgrind cannot name)",
    )
    parser.add_argument(
        "--chunks",
        type=int,
        default=3,
        help="content deltas in each streamed answer (3; two counts apart tell what a stream "
        "costs per chunk from what it costs once)",
    )
    parser.add_argument("--out-dir", default=os.path.join(tempfile.gettempdir(), "request_cost"))
    args = parser.parse_args(argv)
    if args.requests is None:
        args.requests = 300 if args.callgrind else 2000
        argv = [*argv, "--requests", str(args.requests)]
    if args.callgrind:
        return _under_callgrind(argv, args)
    port = _free_port()
    upstream = subprocess.Popen(
        [
            *(sys.executable, "-m", "tests.fixtures.upstream", "--port", str(port)),
            *("--mode", "fast", "--chunks", str(args.chunks)),
        ],
        stdout=subprocess.DEVNULL,
    )
    sink = _otlp_sink(args.requests) if args.telemetry else None
    try:
        _wait_listening(port, upstream)
        if sink is not None:
            _wait_listening(sink[1], sink[0], "OTLP sink")
        with tempfile.TemporaryDirectory() as tmp:
            from gateway.process.engines import run_loop

            url = f"http://127.0.0.1:{port}"
            run_loop(_measure(url, args, f"{tmp}/llmgw.sqlite3"), args.loop)
    finally:
        for child in (upstream, *(sink[:1] if sink is not None else ())):
            child.terminate()
            child.wait()
    return 0


def _otlp_sink(requests: int) -> tuple[subprocess.Popen[bytes], int]:
    """A local OTLP collector that discards what it gets, named by the ``OTEL_*`` variables
    the telemetry reads (a queue that never drops a measured span; the metrics' periodic
    export left out of the windows: once a minute, it is no per-request cost)."""
    port = _free_port()
    sink = subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.otlp", "--port", str(port), "--sink"],
        stdout=subprocess.DEVNULL,
    )
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
    os.environ.setdefault("OTEL_BSP_MAX_QUEUE_SIZE", str(8 * (requests + _WARMUP)))
    os.environ.setdefault("OTEL_METRIC_EXPORT_INTERVAL", str(3_600_000))
    return sink, port


if __name__ == "__main__":
    sys.exit(main())
