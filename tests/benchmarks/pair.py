"""Two gateways served side by side on one core: what one difference between them costs.

    python -m tests.benchmarks.pair telemetry [--rounds 10] [--concurrency 64]
    python -m tests.benchmarks.pair mode --a plain --b routewise-5
    python -m tests.benchmarks.pair tree --a-tree /path/to/other/checkout
    python -m tests.benchmarks.pair workers [--b-workers 2]   # one process against workers
    python -m tests.benchmarks.pair engines --a-engine granian --b-engine builtin
    python -m tests.benchmarks.pair telemetry --control      # the same gateway twice (A/A)

Alternating runs of one gateway (``bench.py``) compare sittings that differ by whatever else
the machine did meanwhile: on the shared 2-core machine fifteen alternated pairs of telemetry
on and off gave +140 µs a request with a standard error of 46. Here both gateways run at once,
pinned to the same core (``--gateway-cpus``), each loaded by its own load generator at the same
concurrency on the other core (where the fast fake upstream and, for telemetry, the OTLP sink
run too). Each round measures both over the same window, so what slows the machine slows both,
and the difference of their CPU per request (each gateway's whole process tree, every thread
included) is what the one difference costs. Which load generator starts first alternates by
round, so neither gateway gets a head start. What is compared:

* ``telemetry``: ``telemetry: {enabled: true}`` (B) against off (A), plain chat;
* ``mode``: two of bench.py's modes (``--a``, ``--b``) on one config, e.g. ``fixed-5`` against
  ``routewise-5``;
* ``tree``: another checkout's code (``--a-tree``, e.g. a ``git worktree`` of an older commit)
  against this one (B), the same config and mode (``--tree-workers N``: both under
  ``llmgw serve --workers N``);
* ``engines``: two HTTP servers (``server.engine``, ``--a-engine`` and ``--b-engine``) under
  the same gateway, mode ``--a``;
* ``workers``: ``llmgw serve --workers N`` (B, ``--b-workers``, 2 by default: the supervisor
  with the actors, N ingress workers and its private nats-server, one process tree) against
  one ``llmgw serve`` (A, the in-process bus), plain chat (``--a``). Each round also prints
  the scaling figure, A's CPU per request over B's (≥ 0.8 is issue #30's goal: N workers on
  N cores then serve at least 0.8 N times what one process serves), and N times it, the
  "equivalent workers". ``--a-tree`` runs both on another checkout's code (its figure
  before a change, in the same sitting).

``--control`` runs A twice: the method's own bias and spread, which a figure is read against.
Each gateway gets about half the core, so each runs at about half its throughput.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from gateway.process.engines import ENGINES
from schemas.process_config import ServerConfig
from tests.benchmarks.bench import (
    _GATEWAY_READY,
    _OTLP_READY,
    _REQUEST_TIMEOUT_S,
    _SURFACES,
    REPO,
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
    start_fast_upstream,
)

__all__ = ["Side", "main"]


@dataclass(frozen=True)
class Side:
    """One of the two gateways: its name, the checkout whose code it runs, whether its
    telemetry is on, and the bench mode its load sends."""

    name: str
    tree: Path = REPO
    telemetry: bool = False
    mode: str = "plain"
    workers: int = 1
    engine: str | None = None  # None: --engine


def _sides(args: argparse.Namespace) -> tuple[Side, Side]:
    if args.compare == "telemetry":
        a, b = Side("off"), Side("on", telemetry=True)
    elif args.compare == "mode":
        on = args.telemetry
        a, b = Side(args.a, mode=args.a, telemetry=on), Side(args.b, mode=args.b, telemetry=on)
    elif args.compare == "engines":
        a = Side(args.a_engine, mode=args.a, telemetry=args.telemetry, engine=args.a_engine)
        b = Side(args.b_engine, mode=args.a, telemetry=args.telemetry, engine=args.b_engine)
    elif args.compare == "workers":
        if args.b_workers < 2:
            raise SystemExit("workers: --b-workers is at least 2")
        tree = REPO if args.a_tree is None else Path(args.a_tree).resolve()
        a = Side("one", tree=tree, mode=args.a)
        b = Side(f"workers={args.b_workers}", tree=tree, mode=args.a, workers=args.b_workers)
    else:
        if args.a_tree is None:
            raise SystemExit("tree: --a-tree names the other checkout")
        tree = Path(args.a_tree).resolve()
        on, n = args.telemetry, args.tree_workers
        a = Side("a-tree", tree=tree, mode=args.a, telemetry=on, workers=n)
        b = Side("b-tree", mode=args.a, telemetry=on, workers=n)
    if args.control:
        b = replace(a, name=a.name + "-2")
    return a, b


def _start_gateway(
    kids: Children, bench_args: argparse.Namespace, tmp: Path, side: Side, upstream: str
) -> tuple[str, int]:
    """One gateway on the gateway cpus in its own directory, running ``side.tree``'s code;
    its URL and pid (with workers: the supervisor's, whose process tree is measured)."""
    home = tmp / side.name
    home.mkdir()
    config = home / "gateway.yaml"
    telemetry = "telemetry: {enabled: true}\n" if side.telemetry else ""
    engine = f"server: {{engine: {side.engine or bench_args.pair_engine}}}\n"
    config.write_text(_gateway_config(upstream) + telemetry + engine)
    serve_args = argparse.Namespace(**{**vars(bench_args), "workers": str(side.workers)})
    cmd = _pinned(bench_args.gateway_cpus, _gateway_cmd(serve_args, config, "inproc://"))
    if side.tree != REPO:  # the other checkout's code first on the path (Children adds ours)
        cmd = ["env", f"PYTHONPATH={side.tree}", *cmd]
    proc, m = kids.start(side.name, cmd, _GATEWAY_READY, cwd=home)
    return m.group(1), proc.pid


def _round(
    kids: Children,
    args: argparse.Namespace,
    order: tuple[Side, Side],
    gateways: dict[str, tuple[str, int]],
) -> dict[str, StepResult]:
    """Load both gateways at once over the same window (their load generators started in
    ``order``); each one's StepResult."""
    procs = {}
    for side in order:
        url, pid = gateways[side.name]
        surface = _SURFACES[side.mode]
        spec = LoadSpec(
            url=f"{url}{surface.path}",
            model=surface.model_for("gateway"),
            mode=side.mode,
            concurrency=args.concurrency,
            warmup=args.warmup,
            duration=args.duration,
            watch_pids={"gateway": pid},
        )
        load = _python("-m", "tests.benchmarks.bench", "_loadgen", json.dumps(asdict(spec)))
        procs[side.name] = kids.spawn(f"loadgen-{side.name}", _pinned(args.load_cpus, load))
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


def summary(label: str, diffs: list[float]) -> str:
    """The mean difference with its standard error, and the median."""
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return (
        f"{label}: mean {mean:+.1f} µs a request (standard error {se:.1f}), "
        f"median {statistics.median(diffs):+.1f}, over {len(diffs)} rounds"
    )


def scaling_summary(workers: int, ratios: list[float]) -> str:
    """The median of the rounds' scaling figures (one process's CPU per request over the
    workers'), N times it, and the verdict against issue #30's ≥ 0.8."""
    scaling = statistics.median(ratios)
    verdict = "meets" if scaling >= 0.8 else "misses"
    return (
        f"scaling: median {scaling:.2f} (range {min(ratios):.2f}-{max(ratios):.2f}), "
        f"{workers} workers ≈ {workers * scaling:.2f} one-process equivalents; "
        f"{verdict} the ≥ 0.8 goal"
    )


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.pair")
    p.add_argument("compare", choices=("telemetry", "mode", "tree", "workers", "engines"))
    p.add_argument("--a", default="plain", help="mode of A (mode; tree: of both)")
    p.add_argument("--b", default="plain", help="mode of B (mode)")
    p.add_argument("--a-tree", help="tree: the checkout A runs (workers: both run)")
    p.add_argument("--b-workers", type=int, default=2, help="workers: B's --workers N (2)")
    p.add_argument("--tree-workers", type=int, default=1, help="tree: both sides' --workers N (1)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=64, help="per gateway (64)")
    p.add_argument("--duration", type=float, default=4.0, help="measured seconds a round (4)")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--gateway-cpus", default="0")
    p.add_argument("--load-cpus", default="1")
    p.add_argument("--control", action="store_true", help="A against itself (A/A)")
    p.add_argument("--telemetry", action="store_true", help="mode, tree: telemetry on for both")
    p.add_argument("--engine", choices=ENGINES, default=ServerConfig().engine)
    p.add_argument("--a-engine", choices=ENGINES, default="granian", help="engines: A's")
    p.add_argument("--b-engine", choices=ENGINES, default="builtin", help="engines: B's")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    a, b = _sides(args)
    bench_args = _parser().parse_args(["--gateway-cpus", args.gateway_cpus])
    bench_args.pair_engine = args.engine
    with tempfile.TemporaryDirectory(prefix="llmgw-pair-") as scratch:
        tmp = Path(scratch)
        kids = Children(tmp)
        try:
            _, upstream = start_fast_upstream(kids, args.load_cpus)
            if a.telemetry or b.telemetry:
                sink = _pinned(args.load_cpus, _python("-m", "tests.fixtures.otlp", "--sink"))
                _, m = kids.start("otlp", sink, _OTLP_READY)
                os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = m.group(1)  # the gateways inherit it
            gateways = {s.name: _start_gateway(kids, bench_args, tmp, s, upstream) for s in (a, b)}
            for side in (a, b):
                url = gateways[side.name][0]
                _check(url, _SURFACES[side.mode].model_for("gateway"), side.mode)
            diffs: list[float] = []
            ratios: list[float] = []
            scaled = b.workers > a.workers  # one process against workers
            extra = " scaling A / B | equivalent workers |" if scaled else ""
            print(f"| round | {a.name} µs/req | {b.name} µs/req | B - A | req/s A / B |{extra}")
            print("|---:|---:|---:|---:|---:|" + ("---:|---:|" if scaled else ""))
            for n in range(1, args.rounds + 1):
                results = _round(kids, args, (a, b) if n % 2 else (b, a), gateways)
                ra, rb = results[a.name], results[b.name]
                cpu_a, cpu_b = server_cpu_us(ra), server_cpu_us(rb)
                if cpu_a is None or cpu_b is None or ra.errors or rb.errors:
                    raise RuntimeError(f"round {n}: no CPU figure or errors: {results}")
                diffs.append(cpu_b - cpu_a)
                ratios.append(cpu_a / cpu_b)
                cells = f" {cpu_a / cpu_b:.2f} | {b.workers * cpu_a / cpu_b:.2f} |"
                print(
                    f"| {n} | {cpu_a:,.0f} | {cpu_b:,.0f} | {cpu_b - cpu_a:+,.0f} | "
                    f"{ra.rps:,.0f} / {rb.rps:,.0f} |" + (cells if scaled else ""),
                    flush=True,
                )
            print(summary(f"{b.name} - {a.name}", diffs))
            if scaled:
                print(scaling_summary(b.workers, ratios))
        finally:
            kids.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
