"""What the telemetry hooks of one plain request cost, export included.

    python -m tests.benchmarks.telemetry_cost [--requests 5000]
    python -m tests.benchmarks.telemetry_cost --callgrind [--requests 2000]

Runs, in one process, the hooks a plain chat request with one attempt calls when telemetry
is on (the SERVER span, the routing span, the attempt's CLIENT span with its answer noted and
its trace context written, the end of each, and the attempt's GenAI metrics) and exports the
spans to a local OTLP sink (``tests.fixtures.otlp --sink`` in a child process). Prints the
microseconds per request on the calling thread's CPU clock and on the process's (the batch
span processor's export thread included, after a flush), less the Prometheus-only metrics
the gateway records with telemetry off. No HTTP server is involved: this is the telemetry's
own share of the gateway's CPU per request, measurable on a busy machine. The garbage
collector is set up as the gateway sets it once started (``settle_gc``: what exists is frozen,
and the thresholds are the gateway's).

With ``--callgrind`` it runs itself again under ``valgrind --tool=callgrind`` and prints the
instructions per request instead (every thread's, the export thread's included: each window
ends with a flush), which do not depend on what else the machine runs.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

_CONFIG: dict[str, Any] = {
    "telemetry": {"enabled": True},
    "models": [
        {
            "id": "m",
            "route": [
                {
                    "kind": "openai_compat",
                    "base_url": "http://127.0.0.1:9/v1",
                    "provider_model_id": "up-m",
                }
            ],
        }
    ],
}


async def _never(*_: Any) -> Any:
    raise AssertionError("the hooks never read or answer the exchange")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _per_request(
    run: Callable[[], None], requests: int, flush: Callable[[], Any], window: str = ""
) -> tuple[float, float]:
    """(thread, process) CPU µs per call of ``run``; under callgrind, the calls and the
    flush are one dump labelled ``window`` (when given)."""
    from tests.benchmarks.request_cost import _ENV_WINDOW, _callgrind

    windowed = bool(window) and os.environ.get(_ENV_WINDOW) == "1"
    flush()
    if windowed:
        _callgrind("-z")
    thread0, process0 = time.thread_time(), time.process_time()
    for _ in range(requests):
        run()
    thread1 = time.thread_time()
    flush()
    process1 = time.process_time()
    if windowed:
        _callgrind("-d", window)
    return 1e6 * (thread1 - thread0) / requests, 1e6 * (process1 - process0) / requests


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=None, help="5000; 2000 with --callgrind")
    parser.add_argument("--callgrind", action="store_true", help="instructions, not CPU time")
    args = parser.parse_args(argv)
    if args.requests is None:
        args.requests = 2000 if args.callgrind else 5000
    if args.callgrind:
        _under_callgrind(args.requests)
        return
    port = _free_port()
    sink = subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.otlp", "--port", str(port), "--sink"],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # a child process's listen: no event to await
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
        os.environ.setdefault("OTEL_BSP_MAX_QUEUE_SIZE", str(8 * args.requests))
        _measure(args.requests)
    finally:
        sink.terminate()
        sink.wait()


def _under_callgrind(requests: int) -> None:
    """Run the measurement under callgrind; print instructions per request."""
    from tests.benchmarks.request_cost import _ENV_WINDOW, _summary

    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--callgrind needs valgrind (callgrind_control) on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        stem = os.path.join(tmp, "callgrind.out")
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={stem}", sys.executable]
        cmd += ["-m", "tests.benchmarks.telemetry_cost", "--requests", str(requests)]
        done = subprocess.run(
            cmd, env={**os.environ, _ENV_WINDOW: "1"}, check=False, stdout=subprocess.DEVNULL
        )
        if done.returncode != 0:
            raise SystemExit(done.returncode)
        dumps = dict(_summary(p) for p in glob.glob(f"{stem}.*"))
    empty = dumps["empty"]
    on, off = ((dumps[w] - empty) / requests for w in ("on", "off"))
    print(f"telemetry on:  {on:10,.0f} instructions/request, all threads")
    print(f"telemetry off: {off:10,.0f} instructions/request")
    print(f"added:         {on - off:10,.0f} instructions/request")


def _measure(requests: int) -> None:
    from gateway.adapters.base import UpstreamTarget
    from gateway.http.request import HttpRequest
    from gateway.ingress.metrics import GatewayMetrics
    from gateway.process.serve import settle_gc
    from gateway.telemetry import start_telemetry
    from schemas import Observation, RouteCandidate, RoutePlan, RouteRequest
    from schemas.config import GatewayConfig

    config = GatewayConfig.model_validate(_CONFIG)
    telemetry = start_telemetry(config)
    assert telemetry is not None
    with_otlp = GatewayMetrics(config, telemetry.metrics)
    without = GatewayMetrics(config, None)
    endpoint = config.models[0].endpoint_ids()[0]
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [],
        "server": ("127.0.0.1", 8080),
        "scheme": "http",
    }
    req = HttpRequest(scope, _never, _never, request_id="r-0123456789abcdef")
    cand = RouteCandidate(
        endpoint=endpoint,
        kind="openai_compat",
        base_url="http://127.0.0.1:9/v1",
        upstream_model="up-m",
        credential_id="k-0123abcd",
    )
    plan, route = RoutePlan(model="m", candidates=(cand,)), RouteRequest(model="m")
    target = UpstreamTarget(
        endpoint=endpoint,
        kind="openai_compat",
        base_url="http://127.0.0.1:9/v1",
        upstream_model="up-m",
        api_key=None,
        timeout=10,
        connect_timeout=1,
    )
    answer = {"id": "chatcmpl-1", "model": "up-m", "choices": [{"finish_reason": "stop"}]}
    obs = Observation(
        endpoint=endpoint,
        model="m",
        outcome="success",
        status=200,
        latency_ms=12.0,
        prompt_tokens=10,
        completion_tokens=5,
        cost_usd=0.0001,
    )

    def traced() -> None:
        trace = telemetry.request(req, req.path)
        trace.routing(route)
        trace.routed(plan, None)
        trace.attempt(1, cand, target, "chat", False)
        trace.answered(1, answer)
        trace.attempt_done(obs)
        trace.finish(200, "")
        with_otlp._genai(obs)

    def untraced() -> None:
        without._genai(obs)

    def flush() -> None:
        telemetry._tracer_provider.force_flush()

    _per_request(traced, requests // 10, flush)  # warm the caches and the connection
    settle_gc()  # the collector tuned as ``llmgw serve`` tunes it once started
    _per_request(lambda: None, 1, flush, "empty")  # what zeroing and dumping cost
    on_thread, on_process = _per_request(traced, requests, flush, "on")
    off_thread, off_process = _per_request(untraced, requests, flush, "off")
    print(
        f"telemetry on:  {on_thread:7.1f} µs/request on the thread, {on_process:7.1f} all threads"
    )
    print(
        f"telemetry off: {off_thread:7.1f} µs/request on the thread, {off_process:7.1f} all threads"
    )
    print(
        f"added:         {on_thread - off_thread:7.1f} µs/request on the thread, "
        f"{on_process - off_process:7.1f} all threads"
    )
    telemetry.shutdown()


if __name__ == "__main__":
    main()
