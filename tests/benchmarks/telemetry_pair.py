"""Telemetry's cost through the real server, measured on two gateways served side by side.

    python -m tests.benchmarks.telemetry_pair [--rounds 10] [--concurrency 64] [--control]

Alternating runs of one gateway with telemetry on and off (``bench.py --telemetry``) compare
sittings that differ by whatever else the machine did meanwhile: on the shared 2-core machine
fifteen such pairs gave +140 µs a request with a standard error of 46. Here both gateways run
at once, pinned to the same core (``--gateway-cpus``), each loaded by its own load generator at
the same concurrency on the other core, one with ``telemetry: {enabled: true}`` exporting to a
local OTLP sink and one without. Each round measures both over the same window, so what slows
the machine slows both, and the difference of their CPU per request (each gateway's whole
process, its export thread included) is telemetry's. ``--control`` runs the same with
telemetry off on both: the method's own bias and spread, which the figure must be read against.

Each gateway gets about half the core, so each runs at about half its throughput; the figure is
telemetry's added CPU per request at that load.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from tests.benchmarks.bench import (
    _GATEWAY_MODEL,
    _GATEWAY_READY,
    _OTLP_READY,
    _REQUEST_TIMEOUT_S,
    _SURFACES,
    _UPSTREAM_READY,
    Children,
    LoadSpec,
    StepResult,
    _check,
    _gateway_cmd,
    _gateway_config,
    _parser,
    _pinned,
    _python,
    server_cpu_us,
)

__all__ = ["main"]


def _start_gateway(
    kids: Children, bench_args: argparse.Namespace, tmp: Path, name: str, upstream: str, on: bool
) -> tuple[str, int]:
    """One gateway on the gateway cpus in its own directory; its URL and pid."""
    home = tmp / name
    home.mkdir()
    config = home / "gateway.yaml"
    telemetry = "telemetry: {enabled: true}\n" if on else ""
    config.write_text(_gateway_config(upstream) + telemetry + "server: {engine: hypercorn}\n")
    cmd = _pinned(bench_args.gateway_cpus, _gateway_cmd(bench_args, config, "inproc://"))
    proc, m = kids.start(name, cmd, _GATEWAY_READY, cwd=home)
    return m.group(1), proc.pid


def _round(
    kids: Children, args: argparse.Namespace, order: list[str], gateways: dict[str, tuple[str, int]]
) -> dict[str, StepResult]:
    """Load every gateway at once over the same window (their load generators started in
    ``order``); each one's StepResult."""
    procs = {}
    for name in order:
        url, pid = gateways[name]
        spec = LoadSpec(
            url=f"{url}{_SURFACES['plain'].path}",
            model=_GATEWAY_MODEL,
            mode="plain",
            concurrency=args.concurrency,
            warmup=args.warmup,
            duration=args.duration,
            watch_pids={"gateway": pid},
        )
        cmd = _pinned(
            args.load_cpus,
            _python("-m", "tests.benchmarks.bench", "_loadgen", json.dumps(asdict(spec))),
        )
        procs[name] = kids.spawn(f"loadgen-{name}", cmd)
    results = {}
    for name, (proc, log) in procs.items():
        try:
            proc.wait(args.warmup + args.duration + _REQUEST_TIMEOUT_S + 60.0)
        finally:
            kids.stop(proc)
        lines = log.read_text(errors="replace").strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"load generator {name} failed:\n" + "\n".join(lines[-20:]))
        result = StepResult(**json.loads(lines[-1]))
        result.target = "gateway"
        results[name] = result
    return results


def _summary(label: str, diffs: list[float]) -> str:
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return (
        f"{label}: mean {mean:+.1f} µs a request (standard error {se:.1f}), "
        f"median {statistics.median(diffs):+.1f}, over {len(diffs)} rounds"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.telemetry_pair")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=64, help="per gateway (64)")
    p.add_argument("--duration", type=float, default=4.0, help="measured seconds a round (4)")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--gateway-cpus", default="0")
    p.add_argument("--load-cpus", default="1")
    p.add_argument("--control", action="store_true", help="telemetry off on both (A/A)")
    args = p.parse_args(argv)
    bench_args = _parser().parse_args(["--gateway-cpus", args.gateway_cpus])
    with tempfile.TemporaryDirectory(prefix="llmgw-telemetry-pair-") as scratch:
        tmp = Path(scratch)
        kids = Children(tmp)
        try:
            _, m = kids.start(
                "upstream",
                _pinned(
                    args.load_cpus,
                    _python("-m", "tests.fixtures.upstream", "--port", "0", "--mode", "fast"),
                ),
                _UPSTREAM_READY,
            )
            upstream = m.group(1)
            _, m = kids.start(
                "otlp",
                _pinned(args.load_cpus, _python("-m", "tests.fixtures.otlp", "--sink")),
                _OTLP_READY,
            )
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = m.group(1)  # the gateways inherit it
            names = ("off", "off-2") if args.control else ("off", "on")
            gateways = {
                name: _start_gateway(kids, bench_args, tmp, name, upstream, name == "on")
                for name in names
            }
            for url, _ in gateways.values():
                _check(url, _GATEWAY_MODEL, "plain")
            a, b = names
            diffs = []
            print(f"| round | {a} µs/req | {b} µs/req | {b} - {a} | req/s {a} / {b} |")
            print("|---:|---:|---:|---:|---:|")
            for n in range(1, args.rounds + 1):
                # Which load generator starts first alternates: neither gateway gets a head start.
                order = [a, b] if n % 2 else [b, a]
                results = _round(kids, args, order, gateways)
                cpu_a, cpu_b = server_cpu_us(results[a]), server_cpu_us(results[b])
                if cpu_a is None or cpu_b is None or results[a].errors or results[b].errors:
                    raise RuntimeError(f"round {n}: no CPU figure or errors: {results}")
                diffs.append(cpu_b - cpu_a)
                print(
                    f"| {n} | {cpu_a:,.0f} | {cpu_b:,.0f} | {cpu_b - cpu_a:+,.0f} | "
                    f"{results[a].rps:,.0f} / {results[b].rps:,.0f} |",
                    flush=True,
                )
            print(_summary(f"{b} - {a}", diffs))
        finally:
            kids.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
