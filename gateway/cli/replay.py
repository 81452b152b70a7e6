"""``llmgw replay``: compare configs on a trace against simulated providers, offline.

    llmgw replay --trace T --providers P --config a.yaml --config b.yaml --out DIR
    llmgw replay --scenario ratelimited --out DIR        # a library scenario, all its configs
    llmgw replay --scenario ratelimited --config equal --config greedy-cost --out DIR
    llmgw replay --url http://HOST:PORT --since 1h --providers P --config a.yaml --out DIR
    llmgw replay synth --scenario ratelimited --seed 7 --out trace.jsonl

The trace is a file (``--trace``), the request log of a running gateway asked of its owner
(``--url`` with an admin key, or ``--bus``, as ``llmgw logs`` asks it), or synthesized from
the scenario's synth spec.

Writes ``report.json``, ``report.md`` and, with matplotlib installed (the ``replay`` extra),
the plots into DIR. A progress line goes to stderr while it runs.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from gateway.cli.common import (
    NotDeliveredError,
    RefusedError,
    Target,
    UsageError,
    admin_key,
    fail,
    parse_since,
)
from schemas import GatewayError

if TYPE_CHECKING:
    import argparse

    from schemas.config import GatewayConfig

SCENARIOS = Path(__file__).resolve().parents[2] / "docs" / "scenarios"
"""The scenario library: one folder per scenario (providers.yaml, synth.yaml, configs/)."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``replay`` (and ``replay synth``)."""
    p = sub.add_parser("replay", help="replay a trace through configs on simulated providers")
    p.add_argument("--trace", help="trace JSONL (replay synth, or llmgw logs --json)")
    p.add_argument("--url", help="trace: a running gateway's request log, via its admin API")
    p.add_argument("--bus", help="trace: a running gateway's request log, over nats://HOST:PORT")
    p.add_argument("--admin-key", help="admin key for --url (default $LLMGW_ADMIN_KEY)")
    p.add_argument("--since", default="1h", help="with --url/--bus: how far back (1h)")
    p.add_argument("--providers", help="the providers file (YAML)")
    p.add_argument(
        "--config",
        action="append",
        default=[],
        help="a config to compare (repeat): a file, or with --scenario one of its configs by name",
    )
    p.add_argument("--scenario", help="a library scenario name or folder: its defaults")
    p.add_argument("--duration", type=float, help="synthesized trace length, seconds")
    p.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    p.add_argument("--slo", type=float, help="TTFT SLO seconds (default: the providers file's)")
    p.add_argument("--out", help="report folder (default: replay-report)")
    p.set_defaults(func=_replay)
    inner = p.add_subparsers(dest="replay_command")
    synth = inner.add_parser("synth", help="write a synthetic trace")
    synth.add_argument("--scenario", required=True, help="a library scenario name or folder")
    synth.add_argument("--seed", type=int, default=7)
    synth.add_argument("--duration", type=float, help="trace length, seconds")
    synth.add_argument("--out", required=True, help="trace JSONL to write")
    synth.set_defaults(func=_synth)


def scenario_dir(name: str) -> Path:
    """The folder of scenario ``name`` (a folder path is taken as is). Raises ValueError."""
    path = Path(name)
    folder = path if path.is_dir() else SCENARIOS / name
    if not (folder / "providers.yaml").is_file():
        known = ", ".join(sorted(p.name for p in SCENARIOS.iterdir() if p.is_dir()))
        raise ValueError(f"no scenario {name!r} (known: {known})")
    return folder


def _synth(args: argparse.Namespace) -> int:
    from gateway.replay.synth import load_synth, synthesize
    from gateway.replay.trace import write_trace

    try:
        spec = load_synth(scenario_dir(args.scenario) / "synth.yaml")
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"llmgw replay synth: {exc}\n")
        return 2
    requests = synthesize(spec, args.seed, duration_seconds=args.duration)
    n = write_trace(args.out, requests, spec.trace_keys())
    sys.stderr.write(f"llmgw replay synth: {n} requests written to {args.out}\n")
    return 0


def _replay(args: argparse.Namespace) -> int:
    from gateway.cli.replay_log import logged_trace
    from gateway.replay.compare import compare
    from gateway.replay.providers import load_providers
    from gateway.replay.report import to_json, to_markdown
    from gateway.replay.synth import load_synth, synthesize
    from gateway.replay.trace import read_keys, read_trace

    if args.log_level is None:  # the gateway's own warnings (benches, circuits) are the report's
        for name in ("actors", "gateway", "bus", "llmgw"):
            logging.getLogger(name).setLevel(logging.ERROR)
    try:
        folder = scenario_dir(args.scenario) if args.scenario else None
        providers = load_providers(args.providers or _need(folder, "providers.yaml"))
        config_paths = [_config_path(c, folder) for c in args.config] or sorted(
            Path(_need(folder, "configs")).glob("*.yaml")
        )
        configs = [(p.stem, _load_config(p)) for p in config_paths]
        if args.trace:
            trace, keys = read_trace(args.trace), read_keys(args.trace)
        elif args.url or args.bus:
            where = Target(url=args.url, key=admin_key(args)) if args.url else Target(bus=args.bus)
            trace, keys = logged_trace(where, parse_since(args.since))
        else:
            spec = load_synth(_need(folder, "synth.yaml"))
            trace = synthesize(spec, args.seed, duration_seconds=args.duration)
            keys = spec.trace_keys()
    except (OSError, ValueError, UsageError) as exc:
        sys.stderr.write(f"llmgw replay: {exc}\n")
        return 2
    except (GatewayError, NotDeliveredError, RefusedError, httpx.HTTPError) as exc:
        message = exc.message if isinstance(exc, GatewayError) else str(exc)
        return fail("replay", f"cannot read the request log: {message}", 1)
    if not configs:
        sys.stderr.write("llmgw replay: no config to replay (--config)\n")
        return 2
    out = Path(args.out or "replay-report")
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    report, _ = compare(
        configs, trace, providers, seed=args.seed, keys=keys, slo=args.slo, progress=_Progress()
    )
    elapsed = time.perf_counter() - started
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    (out / "report.json").write_text(to_json(report), encoding="utf-8")
    (out / "report.md").write_text(to_markdown(report), encoding="utf-8")
    _plots(report, out)
    sys.stdout.write(to_markdown(report))
    simulated = len(trace) * len(configs)
    sys.stderr.write(
        f"llmgw replay: {simulated} requests simulated in {elapsed:.1f} s "
        f"({simulated / max(elapsed, 1e-9):.0f} per second); report in {out}/\n"
    )
    return 0


def _need(folder: Path | None, name: str) -> str:
    if folder is None:
        raise ValueError(f"give --scenario or the {name.removesuffix('.yaml')} file")
    return str(folder / name)


def _config_path(value: str, folder: Path | None) -> Path:
    """The config file ``value`` names: a path, or the scenario's ``configs/<value>.yaml``
    (``equal``, ``greedy-cost``, ...) when no such file exists and a scenario is given."""
    path = Path(value)
    if path.is_file() or folder is None:
        return path
    named = folder / "configs" / f"{value}.yaml"
    if named.is_file():
        return named
    known = ", ".join(sorted(p.stem for p in (folder / "configs").glob("*.yaml")))
    raise ValueError(f"no config file {value!r} and no config of that name in {folder} ({known})")


def _load_config(path: Path) -> GatewayConfig:
    """A config validated whole, routers included. Raises ValueError."""
    from actors.strategies import validate_strategy
    from gateway.process.config import ConfigError, load_config

    try:
        return load_config(str(path), routers=validate_strategy)
    except ConfigError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _plots(report: dict[str, object], out: Path) -> None:
    try:
        from gateway.replay.plots import write_plots
    except ImportError:  # matplotlib is the optional ``replay`` extra
        sys.stderr.write("llmgw replay: no plots (pip install 'llmgw[replay]' for matplotlib)\n")
        return
    write_plots(report, out)


class _Progress:
    """One stderr line, rewritten at most every percent."""

    def __init__(self) -> None:
        self._shown = (-1, "")
        self._live = sys.stderr.isatty()

    def __call__(self, name: str, done: int, total: int) -> None:
        if not self._live:
            return
        pct = 100 * done // max(total, 1)
        if (pct, name) == self._shown:
            return
        self._shown = (pct, name)
        bar = "#" * (pct // 4)
        sys.stderr.write(f"\rreplay {name:<24} [{bar:<25}] {done}/{total}")
        sys.stderr.flush()
