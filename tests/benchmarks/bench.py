"""Gateway overhead benchmark: a fast fake upstream measured direct, then through llmgw.

A script, not a test. From the repository root::

    python -m tests.benchmarks.bench --markdown

It starts the fast fake upstream (``tests.fixtures.upstream --mode fast``) and the gateway
(``gateway.cli.main serve``, one ``openai_compat`` route to that upstream), then, for every mode
(``plain`` JSON, ``stream`` SSE) and concurrency, drives the upstream directly and then the
gateway for a fixed time, and prints requests per second, p50/p99 latency, time to first
byte (streaming) and errors, plus the latency the gateway adds at concurrency 1.

Topology (``--roles``, ``--cluster``; see ``bench_topology.py``): one ``llmgw serve``, or on a
NATS bus an actors host and an ingress apart, optionally in cluster mode; each gateway row
names it, and the gateway's CPU sums every process of it.

Placement (two cores): the gateway (every process of it, and a NATS server when it starts
one) is pinned to ``--gateway-cpus`` (default core 0) with ``taskset``; the upstream and the
load generator share ``--load-cpus`` (default core 1). The load generator is a separate
process: aiohttp, one keep-alive connection per concurrent worker, each worker looping for
``--warmup`` plus ``--duration`` seconds; a request counts when it completes inside the
measured window.
Loopback only; every child process is stopped on exit, Ctrl-C and errors included.

On a shared machine, ``--quiet-wait`` holds each row until the cores are idle and
``--repeat N`` keeps the fastest of N tries (every row's first try, then every row's second,
so a drift in the machine's speed hits every row alike); the ``others' CPU %`` column shows how much
other work shared the cores, and ``server CPU µs/req`` (what the gateway spent per request)
is the figure that moves least with that noise.

Measurement knobs that never change the gateway's files: ``--transport`` swaps the upstream
HTTP client's transport, ``--loop uvloop`` the event loop, ``--hypercorn KEY=VALUE`` sets
Hypercorn config attributes and ``--gateway-profile FILE`` runs the gateway under cProfile,
all through a small launcher (``python -m tests.benchmarks.bench _gateway ... -- serve ...``)
that patches them in before ``gateway.cli.main.main`` runs. See README.md beside this file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import functools
import inspect
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from array import array
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.process.engines import ENGINES
from schemas.process_config import ServerConfig
from tests.benchmarks import litellm_target
from tests.benchmarks.bench_topology import (
    ACTORS_NODE_ID,
    GATEWAY_PROCESSES,
    ROLES,
    role_args,
    topology_config,
    topology_label,
    topology_problem,
    until_served,
    wait_cluster_settled,
)
from tests.benchmarks.proc_cpu import TreeSample, tree_cpu, tree_cpu_spent

if TYPE_CHECKING:
    from collections.abc import Callable

REPO = Path(__file__).resolve().parents[2]

MODES = ("plain", "stream")
# One row per client surface: the gateway translates responses/messages to the canonical chat
# shape and back, so these rows show what translation costs. Also valid ``--modes`` values.
SURFACE_MODES = ("responses", "responses-stream", "messages", "messages-stream")
# Steered rows: chat with ``model: "auto"``, the active chain being five models (each one
# route to the upstream) ordered by the balanced profile: what steering costs over a plain id.
STEERING_MODES = ("auto", "auto-stream")
# Strategy rows: plain chat to a model of N routes (all to the upstream, priced apart), under
# the fixed weighted draw and under RouteWise: what the LP decision costs per request.
STRATEGY_MODES = ("fixed-5", "routewise-5", "routewise-20")
_STRATEGY_MODELS = {
    "fixed-5": ("fixed", 5),
    "routewise-5": ("routewise", 5),
    "routewise-20": ("routewise", 20),
}
_CHAIN = tuple(f"bench-{i}" for i in range(1, 6))
_ADMIN_KEY = "bench-admin"  # only to store --rules; the /v1 rows stay anonymous


@dataclass(frozen=True)
class _Surface:
    """How one mode talks: its path, whether it streams, and what a good answer shows."""

    path: str
    stream: bool
    done: bytes  # must appear in a good answer (a stream's last bytes, a body anywhere)
    body: Callable[[str], dict[str, Any]]
    gateway_model: str = ""  # the model field sent to the gateway ("": the plain model)

    def model_for(self, target: str) -> str:
        """The model field this mode sends to ``target`` (LiteLLM serves the plain model)."""
        if target == "litellm":
            return _GATEWAY_MODEL
        if target != "gateway":
            return _UPSTREAM_MODEL
        return self.gateway_model or _GATEWAY_MODEL


def _chat_body(model: str, stream: bool) -> dict[str, Any]:
    return {"model": model, "messages": _PROMPT, "stream": stream}


_SURFACES: dict[str, _Surface] = {
    "plain": _Surface("/v1/chat/completions", False, b'"choices"', lambda m: _chat_body(m, False)),
    "stream": _Surface(
        "/v1/chat/completions", True, b"data: [DONE]", lambda m: _chat_body(m, True)
    ),
    "responses": _Surface(
        "/v1/responses",
        False,
        b'"output"',
        lambda m: {"model": m, "input": "Say hello in three words."},
    ),
    "responses-stream": _Surface(
        "/v1/responses",
        True,
        b"response.completed",
        lambda m: {"model": m, "input": "Say hello in three words.", "stream": True},
    ),
    "messages": _Surface(
        "/v1/messages",
        False,
        b'"content"',
        lambda m: {"model": m, "max_tokens": 32, "messages": _PROMPT},
    ),
    "messages-stream": _Surface(
        "/v1/messages",
        True,
        b"message_stop",
        lambda m: {"model": m, "max_tokens": 32, "messages": _PROMPT, "stream": True},
    ),
    "auto": _Surface(
        "/v1/chat/completions",
        False,
        b'"choices"',
        lambda m: _chat_body(m, False),
        gateway_model="auto",
    ),
    "auto-stream": _Surface(
        "/v1/chat/completions",
        True,
        b"data: [DONE]",
        lambda m: _chat_body(m, True),
        gateway_model="auto",
    ),
    **{
        mode: _Surface(
            "/v1/chat/completions",
            False,
            b'"choices"',
            lambda m: _chat_body(m, False),
            gateway_model=f"bench-{mode}",
        )
        for mode in STRATEGY_MODES
    },
}
TRANSPORTS = ("as-is", "aiohttp", "httpx")
LOOPS = ("as-is", "asyncio", "uvloop")
TARGETS = ("direct", "floor", "gateway", "litellm")
_DEFAULT_TARGETS = ["direct", "gateway"]
_IN_GATEWAYS_PLACE = ("floor", "litellm")  # a process measured on the gateway's cores
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
_UPSTREAM_READY = re.compile(r"fake upstream listening on (http://\S+)")
_GATEWAY_READY = re.compile(r"llmgw listening on (http://\S+)")
_ACTORS_READY = re.compile(r"llmgw actors running on")
_RELAY_READY = re.compile(r"relay listening on (http://\S+)")
_OTLP_READY = re.compile(r"otlp receiver on (http://\S+)")
_DASHBOARD_READY = re.compile(r"dashboard open: (\S+)")
_NATS_READY = re.compile(r"Server is ready")
_NATS_LISTEN = re.compile(r"Listening for client connections on (\S+):(\d+)")
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 15.0
_REQUEST_TIMEOUT_S = 30.0
_MAX_REQUESTS_PER_STEP = 2_000_000
_UPSTREAM_MODEL = "bench-upstream"
_GATEWAY_MODEL = "bench"
_PROMPT: list[dict[str, str]] = [{"role": "user", "content": "Say hello in three words."}]
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_CORES = "_cores"


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class StepResult:
    """One measured step: a target, a mode and a concurrency, over the measured window."""

    target: str
    mode: str
    concurrency: int
    duration: float
    requests: int
    errors: int
    rps: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    ttfb_p50_ms: float | None
    ttfb_p99_ms: float | None
    cpu_pct: dict[str, float] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)
    topology: str = ""  # gateway rows: one, split, split+cluster or workers=N (bench_topology)
    baseline: bool = False  # --workers N: the one-process row its scaling figure divides by


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted values, linearly interpolated; 0 if empty."""
    if not sorted_values:
        return 0.0
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


# --------------------------------------------------------------------------------------------
# Load generator (runs in its own process, pinned to the load cores)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """What one load-generator process runs."""

    url: str
    model: str
    mode: str
    concurrency: int
    warmup: float
    duration: float
    watch_pids: dict[str, int] = field(default_factory=dict)
    watch_cpus: list[int] = field(default_factory=list)
    timeout: float = _REQUEST_TIMEOUT_S
    max_requests: int = _MAX_REQUESTS_PER_STEP
    api_key: str = "sk-bench"


def _self_cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _cores_busy_seconds(cpus: list[int]) -> float | None:
    """Busy (non-idle, non-iowait) seconds of the given cores since boot, steal included."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    wanted = {f"cpu{c}" for c in cpus}
    busy = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if name in wanted:
            v = [int(x) for x in rest.split()]
            busy += sum(v[:8]) - v[3] - v[4]  # user nice system idle iowait irq softirq steal
    return busy / _CLK_TCK


@dataclass(frozen=True, slots=True)
class _CpuMark:
    """CPU counters at one edge of the window: this process's and the watched cores' busy
    seconds, and each watched server's process tree (see ``proc_cpu.py``)."""

    seconds: dict[str, float | None]
    trees: dict[str, TreeSample | None]


def _cpu_sample(spec: LoadSpec) -> _CpuMark:
    return _CpuMark(
        seconds={"loadgen": _self_cpu_seconds(), _CORES: _cores_busy_seconds(spec.watch_cpus)},
        trees={name: tree_cpu(pid) for name, pid in spec.watch_pids.items()},
    )


class _Window:
    """Shared by the workers: the measured window, the recorded samples, the request cap."""

    def __init__(self, spec: LoadSpec) -> None:
        now = time.perf_counter()
        self.start = now + spec.warmup
        self.end = self.start + spec.duration
        self.latencies = array("d")
        self.ttfbs = array("d")
        self.errors = 0
        self.error_kinds: Counter[str] = Counter()
        self.sent = 0
        self.max_requests = spec.max_requests
        self.cpu_marks: dict[str, _CpuMark] = {}


async def _worker(spec: LoadSpec, win: _Window, body: bytes) -> None:
    """One keep-alive connection, requests back to back until the window closes."""
    import aiohttp

    surface = _SURFACES[spec.mode]
    stream = surface.stream
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {spec.api_key}"}
    timeout = aiohttp.ClientTimeout(total=spec.timeout)
    connector = aiohttp.TCPConnector(limit=1, ttl_dns_cache=None, use_dns_cache=True)
    async with aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
        timeout=timeout,
    ) as session:
        perf = time.perf_counter
        while True:
            t0 = perf()
            if t0 >= win.end or win.sent >= win.max_requests:
                return
            win.sent += 1
            first = 0.0
            error: str | None = None
            try:
                async with session.post(spec.url, data=body, headers=headers) as resp:
                    if stream:
                        tail = b""
                        async for chunk in resp.content.iter_any():
                            if not first:
                                first = perf()
                            tail = (tail + chunk)[-4096:]
                        if resp.status != 200:
                            error = f"HTTP {resp.status}"
                        elif surface.done not in tail[-2048:]:
                            error = f"stream ended without {surface.done.decode()}"
                    else:
                        data = await resp.read()
                        if resp.status != 200:
                            error = f"HTTP {resp.status}"
                        elif surface.done not in data:
                            error = f"200 without {surface.done.decode()}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = type(exc).__name__
            t1 = perf()
            if win.start <= t1 < win.end:
                if error is None:
                    win.latencies.append(t1 - t0)
                    if stream:
                        win.ttfbs.append(first - t0)
                else:
                    win.errors += 1
                    win.error_kinds[error] += 1
            elif error is not None and t1 < win.start:
                win.error_kinds[f"(warm-up) {error}"] += 1


async def _mark_cpu(spec: LoadSpec, win: _Window) -> None:
    """Sample this process's and the watched servers' CPU time at the window's edges (each
    server with every process under it: a supervisor's workers and nats-server too)."""
    for name, at in (("start", win.start), ("end", win.end)):
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        win.cpu_marks[name] = _cpu_sample(spec)


def _cpu_percent(start: _CpuMark, end: _CpuMark, duration: float) -> dict[str, float]:
    """CPU % of one core over the window of this process and of each watched server (its
    whole process tree), plus ``others``: what the watched cores spent on anything else
    (other processes, interrupts, steal)."""
    pct: dict[str, float] = {}
    for name, t0 in start.seconds.items():
        t1 = end.seconds.get(name)
        if t0 is not None and t1 is not None:
            pct[name] = 100.0 * (t1 - t0) / duration
    for name, tree0 in start.trees.items():
        tree1 = end.trees.get(name)
        if tree0 is not None and tree1 is not None:
            pct[name] = 100.0 * tree_cpu_spent(tree0, tree1) / duration
    cores = pct.pop(_CORES, None)
    if cores is not None:
        pct["others"] = max(0.0, cores - sum(pct.values()))
    return pct


async def _load(spec: LoadSpec) -> StepResult:
    body = json.dumps(_SURFACES[spec.mode].body(spec.model)).encode()
    win = _Window(spec)
    marks = asyncio.create_task(_mark_cpu(spec, win))
    await asyncio.gather(*(_worker(spec, win, body) for _ in range(spec.concurrency)))
    await marks
    cpu = _cpu_percent(win.cpu_marks["start"], win.cpu_marks["end"], spec.duration)
    lat = sorted(win.latencies)
    ttfb = sorted(win.ttfbs)
    ms = 1000.0
    stream = _SURFACES[spec.mode].stream
    return StepResult(
        target="",
        mode=spec.mode,
        concurrency=spec.concurrency,
        duration=spec.duration,
        requests=len(lat),
        errors=win.errors,
        rps=len(lat) / spec.duration,
        p50_ms=percentile(lat, 0.50) * ms,
        p99_ms=percentile(lat, 0.99) * ms,
        mean_ms=(sum(lat) / len(lat) * ms) if lat else 0.0,
        ttfb_p50_ms=percentile(ttfb, 0.50) * ms if stream else None,
        ttfb_p99_ms=percentile(ttfb, 0.99) * ms if stream else None,
        cpu_pct=cpu,
        error_samples=[f"{n}x {kind}" for kind, n in win.error_kinds.most_common(5)],
    )


def loadgen_main(argv: list[str]) -> int:
    """``bench _loadgen SPEC_JSON``: run one step, print its StepResult as JSON on stdout."""
    spec = LoadSpec(**json.loads(argv[0]))
    if not spec.url.startswith(tuple(f"http://{h}:" for h in _LOOPBACK)):
        raise SystemExit(f"refusing a non-loopback target: {spec.url}")
    import gc

    gc.collect()
    gc.freeze()
    result = asyncio.run(
        asyncio.wait_for(_load(spec), spec.warmup + spec.duration + spec.timeout + 30.0)
    )
    print(json.dumps(asdict(result)), flush=True)
    return 0


# --------------------------------------------------------------------------------------------
# Gateway launcher (patches measurement knobs in, then runs gateway.cli.main.main)
# --------------------------------------------------------------------------------------------


def _patch_transport(kind: str) -> None:
    """Replace every ``make_http_client`` the gateway's modules hold with one building its
    client on transport ``kind`` (same limits as the gateway's)."""
    import httpx

    import gateway.process.serve  # noqa: F401 (loads every module the server uses)

    limits = httpx.Limits(
        max_connections=1000, max_keepalive_connections=200, keepalive_expiry=30.0
    )

    def make_http_client() -> httpx.AsyncClient:
        if kind == "aiohttp":
            from httpx_aiohttp import AiohttpTransport  # type: ignore[import-not-found]

            return httpx.AsyncClient(transport=AiohttpTransport(limits=limits), timeout=None)
        return httpx.AsyncClient(limits=limits, timeout=None)

    patched = [
        name
        for name, module in list(sys.modules.items())
        if name.startswith("gateway.") and hasattr(module, "make_http_client")
    ]
    if not patched:
        raise SystemExit("--transport: no gateway module defines make_http_client any more")
    for name in patched:
        returns = str(inspect.signature(sys.modules[name].make_http_client).return_annotation)
        if "AsyncClient" not in returns:
            raise SystemExit(
                f"--transport swaps an httpx client's transport, but {name}.make_http_client "
                f"returns {returns}; compare transports on a checkout that uses httpx"
            )
    for name in patched:
        setattr(sys.modules[name], "make_http_client", make_http_client)  # noqa: B010


def _patch_hypercorn(settings: list[str]) -> None:
    """Set Hypercorn config attributes (``KEY=VALUE``, VALUE as JSON, else a string) right
    before serving, by wrapping the ``hypercorn_serve`` that ``gateway.process.engines``
    imported."""
    import gateway.process.engines

    overrides: dict[str, Any] = {}
    for item in settings:
        key, _, value = item.partition("=")
        try:
            overrides[key.strip()] = json.loads(value)
        except ValueError:
            overrides[key.strip()] = value
    original = gateway.process.engines.__dict__["hypercorn_serve"]

    async def serve(app: Any, config: Any, **kwargs: Any) -> None:
        for key, value in overrides.items():
            if not hasattr(config, key):
                raise SystemExit(f"Hypercorn has no config setting {key!r}")
            setattr(config, key, value)
        await original(app, config, **kwargs)

    setattr(gateway.process.engines, "hypercorn_serve", serve)  # noqa: B010 (not re-exported)


def gateway_main(argv: list[str]) -> int:
    """``bench _gateway [--transport T] [--hypercorn K=V]... [--profile F] -- serve ...``."""
    parser = argparse.ArgumentParser(prog="bench _gateway")
    parser.add_argument("--transport", choices=TRANSPORTS, default="as-is")
    parser.add_argument("--hypercorn", action="append", default=[])
    parser.add_argument("--profile")
    parser.add_argument("--loop", choices=LOOPS, default="as-is")
    parser.add_argument("cli", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cli_args = args.cli[1:] if args.cli[:1] == ["--"] else args.cli
    if args.loop == "uvloop":
        try:
            import uvloop  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise SystemExit("--loop uvloop: uvloop is not installed") from None
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    if args.transport != "as-is":
        _patch_transport(args.transport)
    if args.hypercorn:
        _patch_hypercorn(args.hypercorn)
    from gateway.cli.main import main as gateway_cli

    if not args.profile:
        return gateway_cli(cli_args)
    import cProfile

    profiler = cProfile.Profile()
    after = float(os.environ.get("LLMGW_PROFILE_AFTER", "0"))
    if after > 0:  # profile only the steady state: from that many seconds after start
        signal.signal(signal.SIGALRM, lambda *_: profiler.enable())
        signal.setitimer(signal.ITIMER_REAL, after)
    else:
        profiler.enable()
    try:
        return gateway_cli(cli_args)
    finally:
        profiler.disable()
        profiler.dump_stats(args.profile)


# --------------------------------------------------------------------------------------------
# Child processes
# --------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the benchmark process dies (Linux)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Children:
    """The benchmark's child processes; ``close()`` stops them all, last started first."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def spawn(
        self, name: str, cmd: list[str], cwd: Path = REPO
    ) -> tuple[subprocess.Popen[bytes], Path]:
        """Start ``cmd`` in ``cwd`` (the repository is always importable) with stdout and
        stderr going to ``<logdir>/<name>.log``."""
        log = self.logdir / f"{name}.log"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self._procs.append((name, proc))
        return proc, log

    def start(
        self,
        name: str,
        cmd: list[str],
        ready: re.Pattern[str],
        cwd: Path = REPO,
        timeout: float = _START_TIMEOUT_S,
    ) -> tuple[subprocess.Popen[bytes], re.Match[str]]:
        """Spawn ``cmd`` and wait until its log matches ``ready``."""
        proc, log = self.spawn(name, cmd, cwd)
        deadline = time.monotonic() + timeout
        while True:
            text = log.read_text(errors="replace")
            match = ready.search(text)
            if match:
                return proc, match
            if proc.poll() is not None or time.monotonic() > deadline:
                state = (
                    f"exited with {proc.returncode}"
                    if proc.poll() is not None
                    else f"not ready after {timeout:g}s"
                )
                tail = "\n".join(text.splitlines()[-30:])
                raise RuntimeError(f"{name} {state}: {shlex.join(cmd)}\n{tail}")
            time.sleep(0.02)

    def stop(self, proc: subprocess.Popen[bytes]) -> int | None:
        """SIGTERM (graceful for the upstream, the gateway and nats-server), then SIGKILL after
        the stop timeout; returns the exit code."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs = [(n, p) for n, p in self._procs if p is not proc]
        return proc.returncode

    def close(self) -> None:
        """Stop every child still running."""
        for _, proc in reversed(list(self._procs)):
            self.stop(proc)


def _pinned(cpus: str | None, cmd: list[str]) -> list[str]:
    return ["taskset", "-c", cpus, *cmd] if cpus else cmd


def _python(*args: str) -> list[str]:
    return [sys.executable, *args]


def start_fast_upstream(kids: Children, cpus: str | None) -> tuple[subprocess.Popen[bytes], str]:
    """Start the fast fake upstream (pinned to ``cpus`` if given); its process and URL."""
    cmd = _python("-m", "tests.fixtures.upstream", "--port", "0", "--mode", "fast")
    proc, m = kids.start("upstream", _pinned(cpus, cmd), _UPSTREAM_READY)
    return proc, m.group(1)


# --------------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------------


def _check(url: str, model: str, mode: str, api_key: str = "sk-bench") -> None:
    """One request before measuring, so a broken setup fails loudly instead of as errors."""
    surface = _SURFACES[mode]
    body = json.dumps(surface.body(model)).encode()
    req = urllib.request.Request(
        f"{url}{surface.path}",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # loopback only
            data = resp.read()
    except OSError as exc:
        raise RuntimeError(f"{url} ({mode}): {exc}") from exc
    if surface.done not in data:
        raise RuntimeError(f"{url} ({mode}): no {surface.done.decode()} in {data[-200:]!r}")


def _run_step(
    kids: Children,
    args: argparse.Namespace,
    target: str,
    url: str,
    mode: str,
    concurrency: int,
    watch_pids: dict[str, int],
    watch_cpus: list[int],
) -> StepResult:
    spec = LoadSpec(
        api_key=getattr(args, "bench_key", "sk-bench"),
        url=f"{url}{_SURFACES[mode].path}",
        model=_SURFACES[mode].model_for(target),
        mode=mode,
        concurrency=concurrency,
        warmup=args.warmup,
        duration=args.duration,
        watch_pids=watch_pids,
        watch_cpus=watch_cpus,
    )
    cmd = _pinned(
        args.load_cpus,
        _python("-m", "tests.benchmarks.bench", "_loadgen", json.dumps(asdict(spec))),
    )
    proc, log = kids.spawn(f"loadgen-{target}-{mode}-{concurrency}", cmd)
    try:
        proc.wait(args.warmup + args.duration + _REQUEST_TIMEOUT_S + 60.0)
    except subprocess.TimeoutExpired:
        raise RuntimeError("the load generator did not finish in time") from None
    finally:
        kids.stop(proc)
    lines = log.read_text(errors="replace").strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = "\n".join(lines[-20:])
        raise RuntimeError(f"load generator failed ({proc.returncode}):\n{tail}")
    result = StepResult(**json.loads(lines[-1]))
    result.target = target
    return result


def _cli_has_loop_flag() -> bool:
    """Whether this checkout's ``llmgw serve`` takes ``--loop`` (newer ones do)."""
    done = subprocess.run(
        _python("-m", "gateway.cli.main", "serve", "--help"),
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    return "--loop" in done.stdout


def _gateway_cmd(
    args: argparse.Namespace, config: Path, bus_url: str, role: str = "all"
) -> list[str]:
    """The command of one gateway process of ``role`` (``all``, ``ingress`` or ``actors``).
    The measurement knobs of the HTTP side (transport, Hypercorn, profile) go to the process
    that serves HTTP; an actors host gets the event loop and the log level only."""
    serve = ["serve", "--config", str(config), *role_args(role, bus_url)]
    if args.workers != "1":
        serve += ["--workers", str(args.workers)]
    if args.gateway_log_level:
        serve = ["--log-level", args.gateway_log_level, *serve]
    loop = args.loop
    if loop != "as-is" and _cli_has_loop_flag():
        serve += ["--loop", loop]  # the CLI chooses its loop itself: ask it
        loop = "as-is"
    http = role != "actors"
    patched = loop != "as-is" or (http and (args.transport != "as-is" or args.hypercorn))
    if not patched and not (http and args.gateway_profile):
        return _python("-m", "gateway.cli.main", *serve)
    launcher = ["-m", "tests.benchmarks.bench", "_gateway", "--loop", loop]
    if http:
        launcher += ["--transport", args.transport]
        for item in args.hypercorn:
            launcher += ["--hypercorn", item]
        if args.gateway_profile:
            launcher += ["--profile", str(Path(args.gateway_profile).resolve())]
    return _python(*launcher, "--", *serve)


def _start_nats(kids: Children, cpus: str | None, store: Path) -> tuple[str, int]:
    binary = Path(sys.executable).parent / "nats-server"
    found = str(binary) if binary.exists() else shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found next to the interpreter nor on PATH")
    cmd = _pinned(cpus, [found, "-a", "127.0.0.1", "-p", "-1", "-js", "-sd", str(store)])
    proc, _ = kids.start("nats-server", cmd, _NATS_READY)
    text = (kids.logdir / "nats-server.log").read_text(errors="replace")
    match = _NATS_LISTEN.search(text)
    if match is None:
        kids.stop(proc)
        raise RuntimeError(f"nats-server did not say where it listens:\n{text[-2000:]}")
    return f"nats://{match.group(1)}:{match.group(2)}", proc.pid


_GENEROUS = (
    "--rpm",
    str(10**9),
    "--tpm",
    str(10**12),
    "--concurrency",
    str(10**6),
    "--budget",
    f"{10**9}/month",
)


def _bench_key(where: list[str], *, limited: bool) -> str:
    """A gateway API key made with ``llmgw keys create``: with a limit no benchmark reaches
    (``--limit``; every gateway request is then checked by its owner), or without (``--key``,
    the baseline: auth is on in both, so the difference is the limit's). ``where`` is
    ``["--db", FILE]`` before the gateway starts (its owner loads them at start) or, in a
    cluster (whose keys and limits are in JetStream, not the file), ``["--bus", URL]`` once
    the owners run."""
    done = subprocess.run(
        _python(
            "-m",
            "gateway.cli.main",
            "keys",
            "create",
            *where,
            "--org",
            "bench",
            "--user",
            "bench",
            "--role",
            "pro",
            *(_GENEROUS if limited else ()),
            "--json",
        ),
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"llmgw keys create failed: {done.stderr[-2000:]}")
    return str(json.loads(done.stdout)["key"])


def _start_postgres(services: contextlib.ExitStack, cpus: str | None) -> str:
    """A throwaway PostgreSQL (the tests' ``start_postgres_server``, stopped when ``services``
    closes) running on ``cpus``: its processes inherit this one's CPU affinity, set to
    ``cpus`` for the start only. Returns the URL of a database made for the benchmark."""
    from tests.fixtures.postgres import (
        PostgresServerError,
        create_database,
        start_postgres_server,
    )

    before = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, _cpu_list(cpus))
    try:
        server = services.enter_context(start_postgres_server())
    except PostgresServerError as exc:
        raise RuntimeError(str(exc)) from None
    finally:
        os.sched_setaffinity(0, before)
    return create_database(server, "llmgw_bench")


def _start_gateway(
    kids: Children,
    args: argparse.Namespace,
    tmp: Path,
    upstream_url: str,
    bus_url: str,
    database_url: str | None = None,
) -> tuple[str, dict[str, int]]:
    """Start the gateway's processes of ``args.roles`` pinned to the gateway cpus, the request
    log in the PostgreSQL at ``database_url`` if given; return the URL serving HTTP and the
    pids whose CPU is the gateway's, by name. With ``--cluster``, return once placement
    settled."""
    config = tmp / "gateway.yaml"
    config.write_text(
        _gateway_config(upstream_url)
        + ("telemetry: {enabled: true}\n" if args.telemetry else "")
        + f"server: {{engine: {args.engine}, busy_poll_us: {args.busy_poll_us}}}\n"
        + topology_config(args.cluster, database_url)
    )
    if (args.limit or args.key) and not args.cluster:
        args.bench_key = _bench_key(["--db", str(tmp / "llmgw.sqlite3")], limited=args.limit)
    pids: dict[str, int] = {}
    role = "all"
    if args.roles == "split":
        actors, _ = kids.start(
            "actors",
            _pinned(args.gateway_cpus, _gateway_cmd(args, config, bus_url, "actors")),
            _ACTORS_READY,
            cwd=tmp,  # its database (default ./llmgw.sqlite3) stays out of the repo
        )
        pids["actors"] = actors.pid
        role = "ingress"
    gateway, m = kids.start(
        "gateway",
        _pinned(args.gateway_cpus, _gateway_cmd(args, config, bus_url, role)),
        _GATEWAY_READY,
        cwd=tmp,  # its database (default ./llmgw.sqlite3) stays out of the repo
    )
    pids["gateway"] = gateway.pid
    url = m.group(1)
    if args.cluster:
        members = wait_cluster_settled(url, _ADMIN_KEY, _START_TIMEOUT_S)
        owned = [u for member in members["members"] for u in member["units"]]
        _log(f"cluster settled: {len(owned)} units owned by {ACTORS_NODE_ID}")
        if args.limit or args.key:
            args.bench_key = _bench_key(["--bus", bus_url], limited=args.limit)
    return url, pids


def _gateway_config(upstream_url: str) -> str:
    """The plain model, and the five-model chain the ``auto`` rows steer over."""
    text = "models:\n"
    for model_id in (_GATEWAY_MODEL, *_CHAIN):
        text += (
            f"  - id: {model_id}\n"
            "    route:\n"
            "      - kind: openai_compat\n"
            f"        base_url: {upstream_url}/v1\n"
            f"        provider_model_id: {_UPSTREAM_MODEL}\n"
            "        api_key: sk-bench\n"
        )
    for mode, (router, n) in _STRATEGY_MODELS.items():
        text += f"  - id: bench-{mode}\n    router: {router}\n    route:\n"
        for i in range(n):
            text += (
                "      - kind: openai_compat\n"
                f"        base_url: {upstream_url}/v1\n"
                f"        provider_model_id: {_UPSTREAM_MODEL}\n"
                "        api_key: sk-bench\n"
                f"        pricing: {{prompt: {0.1 * (i + 1):.2f}, "
                f"completion: {0.4 * (i + 1):.2f}}}\n"
            )
    chain = ", ".join(_CHAIN)
    return (
        text
        + f"chains:\n  - {{name: bench5, models: [{chain}]}}\n"
        + (f"steering: {{active_chain: bench5, profile: balanced}}\nadmin_key: {_ADMIN_KEY}\n")
    )


def _bench_rules(n: int) -> list[dict[str, Any]]:
    """``n`` routing rules no bench request matches, each failing on its last clause, so
    every ``auto`` request evaluates all of them (3 comparisons each, one a regex)."""
    return [
        {
            "name": f"r{i}",
            "route": "auto:bench5",
            "when": {
                "$and": [
                    {"params.surface": "chat"},
                    {"params.prompt_tokens": {"$lt": 10**9}},
                    {"metadata.team": {"$regex": f"^team-{i}$"}},
                ]
            },
        }
        for i in range(n)
    ]


def _put_rules(gateway_url: str, n: int) -> None:
    body = json.dumps({"rules": _bench_rules(n)}).encode()
    req = urllib.request.Request(
        f"{gateway_url}/api/fallback/routing-rules",
        data=body,
        method="PUT",
        headers={"authorization": f"Bearer {_ADMIN_KEY}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=_START_TIMEOUT_S) as resp:
        resp.read()


def run(args: argparse.Namespace) -> list[StepResult]:
    """Start the upstream and the gateway, measure every step, return the results."""
    results: list[StepResult] = []
    with (
        tempfile.TemporaryDirectory(prefix="llmgw-bench-") as scratch,
        contextlib.ExitStack() as services,  # closed after the children stopped
    ):
        tmp = Path(scratch)
        kids = Children(Path(args.keep_logs) if args.keep_logs else tmp)
        kids.logdir.mkdir(parents=True, exist_ok=True)
        try:
            upstream, upstream_url = start_fast_upstream(kids, args.load_cpus)
            bus_url = args.bus
            nats_pid = 0
            if bus_url == "nats":
                bus_url, nats_pid = _start_nats(kids, args.gateway_cpus, tmp / "nats")
            if args.telemetry:
                _, m = kids.start(
                    "otlp",
                    _pinned(args.load_cpus, _python("-m", "tests.fixtures.otlp", "--sink")),
                    _OTLP_READY,
                )
                # The gateway's SDK reads these; the bench's children inherit its environment.
                os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = m.group(1)
            gateway_url = ""
            gateway_pids: dict[str, int] = {}
            if "gateway" in args.targets:
                database_url = _start_postgres(services, args.load_cpus) if args.postgres else None
                gateway_url, gateway_pids = _start_gateway(
                    kids, args, tmp, upstream_url, bus_url, database_url
                )
                if args.rules:
                    _put_rules(gateway_url, args.rules)
                if args.dashboard:
                    viewer = _python(
                        "-m", "tests.benchmarks.dashboard_viewer", gateway_url, _ADMIN_KEY
                    )
                    kids.start(
                        "dashboard",
                        _pinned(args.load_cpus, [*viewer, args.dashboard]),
                        _DASHBOARD_READY,
                    )
            urls = {"direct": upstream_url, "gateway": gateway_url}
            watch_pids = {"upstream": upstream.pid, **gateway_pids}
            if "floor" in args.targets:
                relay = _python("-m", "tests.benchmarks.relay", "--upstream", upstream_url)
                floor, m = kids.start("floor", _pinned(args.gateway_cpus, relay), _RELAY_READY)
                urls["floor"], watch_pids["floor"] = m.group(1), floor.pid
            if "litellm" in args.targets:
                if not args.litellm:
                    raise RuntimeError("--targets litellm needs --litellm BIN")
                urls["litellm"], watch_pids["litellm"] = litellm_target.start(
                    kids.start,
                    args.litellm,
                    litellm_target.config(
                        upstream_url,
                        _GATEWAY_MODEL,
                        _UPSTREAM_MODEL,
                        getattr(args, "bench_key", "sk-bench"),
                    ),
                    tmp,
                    functools.partial(_pinned, args.gateway_cpus),
                )
            if nats_pid:
                watch_pids["nats"] = nats_pid
            watch_cpus = sorted(set(_cpu_list(args.gateway_cpus) + _cpu_list(args.load_cpus)))
            topology = topology_label(args.roles, args.cluster, args.workers)
            _log(
                f"upstream {upstream_url} (cpus {args.load_cpus}); gateway {gateway_url} "
                f"(cpus {args.gateway_cpus}, bus {bus_url}, topology {topology}, transport "
                f"{args.transport})"
            )
            # An ingress apart answers 503 until the actors it asks run: wait for a served one.
            patience = _START_TIMEOUT_S if args.roles == "split" else 0.0
            for mode in args.modes:
                for target in args.targets:
                    check = functools.partial(
                        _check,
                        urls[target],
                        _SURFACES[mode].model_for(target),
                        mode,
                        getattr(args, "bench_key", "sk-bench"),
                    )
                    until_served(check, patience)
            rows = [
                (mode, concurrency, target)
                for mode in args.modes
                for concurrency in args.concurrency
                for target in args.targets
            ]
            # Try k of every row before try k + 1 of any: the machine's speed drifts over
            # minutes here, and rows tried back to back each caught a different part of it
            # (a stream row after its plain row read anything from 0.58 to 1.0 of its rate).
            tries: dict[tuple[str, int, str], list[StepResult]] = {row: [] for row in rows}
            for _ in range(args.repeat):
                for mode, concurrency, target in rows:
                    _wait_quiet(watch_cpus, args.quiet_wait, args.quiet_threshold)
                    r = _run_step(
                        kids,
                        args,
                        target,
                        urls[target],
                        mode,
                        concurrency,
                        watch_pids,
                        watch_cpus,
                    )
                    r.topology = topology if target == "gateway" else ""
                    tries[mode, concurrency, target].append(r)
                    _log(
                        f"{target:7} {mode:6} c={concurrency:<3} {r.rps:9.0f} req/s "
                        f"p50 {r.p50_ms:7.2f} ms p99 {r.p99_ms:7.2f} ms "
                        f"errors {r.errors} others' CPU "
                        f"{r.cpu_pct.get('others', 0.0):.0f}%"
                        + (f" {r.error_samples}" if r.error_samples else "")
                    )
            results.extend(_best(tries[row]) for row in rows)
        finally:
            kids.close()
    return results


def _best(tries: list[StepResult]) -> StepResult:
    """The try with the most requests per second; errors and their samples of every try are
    kept, so repeating never hides a failure."""
    best = max(tries, key=lambda r: r.rps)
    best.errors = sum(r.errors for r in tries)
    best.error_samples = [e for r in tries for e in r.error_samples][:5]
    return best


def _wait_quiet(cpus: list[int], patience: float, threshold: float) -> None:
    """Wait (up to ``patience`` seconds) until the benchmark's cores are idle but for
    ``threshold`` % of one core, so a row does not start while other work hogs them.

    Our own children are idle between rows, so whatever is busy is someone else."""
    if patience <= 0:
        return
    deadline = time.monotonic() + patience
    busy = 0.0
    while True:
        b0, t0 = _cores_busy_seconds(cpus), time.monotonic()
        time.sleep(0.5)
        b1, t1 = _cores_busy_seconds(cpus), time.monotonic()
        if b0 is None or b1 is None:
            return
        busy = 100.0 * (b1 - b0) / (t1 - t0)
        if busy <= threshold:
            return
        if time.monotonic() >= deadline:
            _log(
                f"cores {cpus} still {busy:.0f}% busy with other work after {patience:g}s; "
                "measuring anyway (see the others' CPU column)"
            )
            return


def _log(line: str) -> None:
    sys.stderr.write(f"[bench] {line}\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _gateway_pct(r: StepResult) -> float:
    """CPU % of every process of the gateway's topology: the gateway (or the ingress), an
    actors host apart and a nats-server the script started."""
    return sum(r.cpu_pct.get(name, 0.0) for name in GATEWAY_PROCESSES)


def _cpu_cell(r: StepResult) -> str:
    gw = r.cpu_pct.get(r.target) if r.target in _IN_GATEWAYS_PLACE else _gateway_pct(r)
    return "/".join(_fmt(v, 0) for v in (gw, r.cpu_pct.get("upstream"), r.cpu_pct.get("loadgen")))


def server_cpu_us(r: StepResult) -> float | None:
    """CPU microseconds the measured server spent per request: the gateway (plus an actors
    host apart and a nats-server the script started) for gateway rows, the relay for floor
    rows, LiteLLM for litellm rows, the upstream for direct rows.

    Unlike req/s this hardly moves when other work shares the core, and one core's worth
    of it (1e6 / value) is the throughput that core would reach on its own."""
    if r.target == "gateway":
        if "gateway" not in r.cpu_pct:
            return None
        pct = _gateway_pct(r)
    elif r.target in _IN_GATEWAYS_PLACE:
        if r.target not in r.cpu_pct:
            return None
        pct = r.cpu_pct[r.target]
    else:
        if "upstream" not in r.cpu_pct:
            return None
        pct = r.cpu_pct["upstream"]
    return 1e4 * pct / r.rps if r.rps else None


def scaling_lines(results: list[StepResult]) -> list[str]:
    """For each ``--workers N`` gateway row with its one-process baseline row: the scaling
    figure, one process's gateway CPU per request over N workers' (≥ 0.8: the workers add
    at most a quarter to a request's CPU, so N of them on N idle cores reach ≥ 0.8 N times
    one process's throughput)."""
    base = {(r.mode, r.concurrency): r for r in results if r.baseline}
    lines: list[str] = []
    for r in results:
        b = base.get((r.mode, r.concurrency))
        if r.target != "gateway" or r.baseline or b is None:
            continue
        one, many = server_cpu_us(b), server_cpu_us(r)
        if not one or not many:
            continue
        scaling = one / many
        verdict = "meets" if scaling >= 0.8 else "misses"
        lines.append(
            f"{r.topology} scaling, {r.mode} c={r.concurrency}: {scaling:.2f} (one process "
            f"{one:,.0f} µs ÷ {r.topology} {many:,.0f} µs of gateway CPU per request; "
            f"{verdict} the ≥ 0.8 target)"
        )
    return lines


def with_baseline(results: list[StepResult], baseline: list[StepResult]) -> list[StepResult]:
    """``results`` with each one-process ``baseline`` row (marked as such) just before the
    ``--workers`` gateway row of its mode and concurrency."""
    base = {(r.mode, r.concurrency): r for r in baseline}
    out: list[StepResult] = []
    for r in results:
        b = base.pop((r.mode, r.concurrency), None) if r.target == "gateway" else None
        if b is not None:
            b.baseline = True
            out.append(b)
        out.append(r)
    for b in base.values():
        b.baseline = True
        out.append(b)
    return out


def _cpu_list(spec: str | None) -> list[int]:
    """Core numbers of a taskset list like ``0``, ``0,2`` or ``0-3``; None: every core."""
    if not spec:
        return list(range(os.cpu_count() or 1))
    cores: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cores += range(int(lo), int(hi or lo) + 1)
    return cores


def report(results: list[StepResult], args: argparse.Namespace, markdown: bool) -> str:
    """The results table, the added latency at concurrency 1 and the targets' verdicts."""
    head = [
        "target",
        "topology",
        "mode",
        "conc",
        "req/s",
        "p50 ms",
        "p99 ms",
        "TTFB p50 ms",
        "errors",
        "server CPU µs/req",
        "CPU % gw/up/lg",
        "others' CPU %",
    ]
    rows = [
        [
            r.target,
            r.topology or "—",
            r.mode,
            str(r.concurrency),
            _fmt(r.rps, 0),
            _fmt(r.p50_ms),
            _fmt(r.p99_ms),
            _fmt(r.ttfb_p50_ms),
            str(r.errors),
            _fmt(server_cpu_us(r), 0),
            _cpu_cell(r),
            _fmt(r.cpu_pct.get("others"), 0),
        ]
        for r in results
    ]
    out: list[str] = []
    if markdown:
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join("---" if i < 3 else "---:" for i in range(len(head))) + "|")
        out += ["| " + " | ".join(row) + " |" for row in rows]
    else:
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
        out.append("  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)))
        out += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    out.append("")
    by_key = {(r.target, r.mode, r.concurrency): r for r in results if not r.baseline}
    bullet = "- " if markdown else ""
    for mode in args.modes:
        d, g = by_key.get(("direct", mode, 1)), by_key.get(("gateway", mode, 1))
        if d and g:
            added = g.p50_ms - d.p50_ms
            verdict = "meets" if added <= 1.0 else "misses"
            line = (
                f"{bullet}added p50 at concurrency 1, {mode}: {added:.2f} ms "
                f"(gateway {g.p50_ms:.2f} minus direct {d.p50_ms:.2f}; {verdict} the ≤ 1 ms "
                "target)"
            )
            if g.ttfb_p50_ms is not None and d.ttfb_p50_ms is not None:
                line += f"; added TTFB p50 {g.ttfb_p50_ms - d.ttfb_p50_ms:.2f} ms"
            f = by_key.get(("floor", mode, 1))
            if f:
                line += (
                    f"; a byte relay in its place adds {f.p50_ms - d.p50_ms:.2f} ms (floor "
                    f"{f.p50_ms:.2f}), so {g.p50_ms - f.p50_ms:.2f} ms is the gateway's own"
                )
            out.append(line)
    for mode in args.modes:
        g64 = by_key.get(("gateway", mode, 64))
        if g64:
            verdict = "meets" if g64.rps >= 1000 and g64.errors == 0 else "misses"
            line = (
                f"{bullet}gateway at concurrency 64, {mode}: {g64.rps:,.0f} req/s "
                f"({verdict} the ≥ 1,000 req/s target)"
            )
            us = server_cpu_us(g64)
            if us:
                line += (
                    f"; {us:,.0f} µs of gateway CPU per request, i.e. ≈ {1e6 / us:,.0f} req/s "
                    "on a whole idle core"
                )
            out.append(line)
    out += [bullet + line for line in scaling_lines(results)]
    errors = [r for r in results if r.error_samples]
    for r in errors:
        out.append(f"{bullet}{r.target} {r.mode} c={r.concurrency}: {', '.join(r.error_samples)}")
    return "\n".join(out)


def _environment(args: argparse.Namespace) -> str:
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    rev = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            text=True,
            capture_output=True,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            text=True,
            capture_output=True,
            check=False,
        ).stdout
        rev += " (uncommitted changes)" if dirty.strip() else ""
    bus = "nats (a nats-server started beside the gateway)" if args.bus == "nats" else args.bus
    if args.roles == "split":
        bus += "; topology split: one llmgw serve --role actors and one --role ingress"
        bus += ", cluster.enabled (one actors host, snapshots in JetStream)" if args.cluster else ""
    if args.postgres:
        bus += "; request log in PostgreSQL (database.url) on the load cpus"
    knobs = "".join(f"hypercorn {h}; " for h in args.hypercorn)
    knobs += f"engine {args.engine}; " if args.engine != "hypercorn" else ""
    knobs += f"--workers {args.workers}; " if args.workers != "1" else ""
    knobs += f"busy_poll_us {args.busy_poll_us}; " if args.busy_poll_us else ""
    if args.loop != "as-is":
        knobs += f"gateway event loop {args.loop}; "
    if args.gateway_log_level:
        knobs += f"gateway log level {args.gateway_log_level}; "
    if args.dashboard:
        knobs += f"dashboard {args.dashboard} page open in chromium (on the load cpus); "
    if args.gateway_profile:
        knobs += "gateway under cProfile (slower); "
    repeat = f", fastest of {args.repeat} tries" if args.repeat > 1 else ""
    return (
        f"{cpu or 'unknown CPU'}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {platform.system()} {platform.release()}; "
        f"commit {rev or '?'}; gateway on cpus {args.gateway_cpus or 'any'}, upstream "
        f"and load generator on cpus {args.load_cpus or 'any'}; bus {bus}; "
        f"upstream transport {args.transport}; {knobs}{args.warmup:g} s warm-up + "
        f"{args.duration:g} s measured per row{repeat}"
    )


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _csv(choices: tuple[str, ...] | None = None) -> Any:
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if choices is not None and t not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"expected a comma list of {choices}, got {text!r}")
        return items

    return parse


def _ints(text: str) -> list[int]:
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,16,64, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("concurrency values must be >= 1")
    return values


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench",
        description="Measure a fast fake upstream direct and through the gateway.",
    )
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per row (5)")
    p.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per row (1)")
    p.add_argument(
        "--concurrency",
        type=_ints,
        default=[1, 16, 64],
        help="comma list of concurrent connections (1,16,64)",
    )
    p.add_argument(
        "--modes",
        type=_csv(MODES + SURFACE_MODES + STEERING_MODES + STRATEGY_MODES),
        default=list(MODES),
        help="comma list of plain,stream (both), the surface rows "
        + ",".join(SURFACE_MODES)
        + ", the steered rows "
        + ",".join(STEERING_MODES)
        + " and the strategy rows "
        + ",".join(STRATEGY_MODES),
    )
    p.add_argument(
        "--targets",
        type=_csv(TARGETS),
        default=_DEFAULT_TARGETS,
        help="comma list of direct,gateway (both), and floor: a byte relay in the gateway's "
        "place (tests/benchmarks/relay.py), what any process in the path costs; litellm: "
        "the LiteLLM proxy in the gateway's place (needs --litellm)",
    )
    p.add_argument(
        "--litellm",
        metavar="BIN",
        help="the litellm script of a venv of its own (tests/benchmarks/litellm_target.py)",
    )
    p.add_argument(
        "--bus",
        default="inproc://",
        help="gateway bus: inproc:// (default), nats://HOST:PORT, or 'nats' to "
        "start a nats-server pinned beside the gateway",
    )
    p.add_argument(
        "--roles",
        choices=ROLES,
        default="one",
        help="one: a single llmgw serve (default); split (NATS bus only): one llmgw serve "
        "--role actors and one --role ingress, both on --gateway-cpus, their CPU summed",
    )
    p.add_argument(
        "--cluster",
        action="store_true",
        help="with --roles split: cluster.enabled (the actors host heartbeats into JetStream, "
        "owns its units under fencing and keeps its snapshots there)",
    )
    p.add_argument(
        "--postgres",
        action="store_true",
        help="keep the request log in a PostgreSQL the script starts (Debian's package) on "
        "--load-cpus (database.url), as several actors hosts must; its CPU is not the "
        "gateway's (it shows in the others' column)",
    )
    p.add_argument(
        "--rules",
        type=int,
        default=0,
        help="store N routing rules that no request matches before measuring (0): what "
        "evaluating them costs every auto row",
    )
    p.add_argument(
        "--telemetry",
        action="store_true",
        help="turn the gateway's OpenTelemetry on (telemetry.enabled), exporting to a local "
        "OTLP sink on the load cores: what tracing and the OTLP metrics cost",
    )
    p.add_argument(
        "--limit",
        action="store_true",
        help="put a generous limit (rpm, tpm, concurrency, budget) on the benchmark's gateway "
        "key, so every request is admitted by the limits' owner: what a limit costs "
        "(compare with --key)",
    )
    p.add_argument(
        "--key",
        action="store_true",
        help="use a gateway API key without limits (auth on): the baseline for --limit",
    )
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    p.add_argument("--gateway-cpus", default="0", help="taskset list for the gateway (0)")
    p.add_argument(
        "--load-cpus", default="1", help="taskset list for the upstream and the load generator (1)"
    )
    p.add_argument("--no-pin", action="store_true", help="do not use taskset")
    p.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="as-is",
        help="upstream HTTP client transport: as-is (the gateway's own choice), "
        "aiohttp (httpx over httpx-aiohttp), httpx (httpx's default)",
    )
    p.add_argument(
        "--loop",
        choices=LOOPS,
        default="as-is",
        help="the gateway's event loop: as-is (the CLI's default), asyncio or uvloop",
    )
    p.add_argument(
        "--hypercorn",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a Hypercorn config attribute (repeatable), e.g. backlog=2048",
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default=ServerConfig().engine,
        help="the gateway's HTTP server (server.engine, its default unless given; granian "
        "needs the granian extra)",
    )
    p.add_argument(
        "--busy-poll-us",
        type=int,
        default=0,
        metavar="US",
        help="server.busy_poll_us: the loop polls this long after each write (0: off)",
    )
    p.add_argument(
        "--workers",
        default="1",
        help="llmgw serve --workers N (auto: one per core it may use): the actors plus N "
        "ingress processes on a private nats-server; the workers inherit --gateway-cpus, the "
        "CPU figures count every process of it, and the gateway rows are measured again on "
        "one process (no --workers) for the scaling figure",
    )
    p.add_argument("--gateway-log-level", help="pass --log-level to the gateway")
    p.add_argument(
        "--gateway-profile",
        metavar="FILE",
        help="run the gateway under cProfile and write its stats to FILE",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="measure every row N times and keep the fastest try (for a busy machine) (1)",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=20.0,
        metavar="SECONDS",
        help="before each row, wait up to this long for the cores to be idle (20)",
    )
    p.add_argument(
        "--quiet-threshold",
        type=float,
        default=15.0,
        metavar="PERCENT",
        help="'idle' for --quiet-wait: other work below this %% of one core (15)",
    )
    p.add_argument(
        "--dashboard",
        metavar="PAGE",
        help="keep this dashboard page (overview, events, ...) open in headless chromium",
    )
    p.add_argument("--json", metavar="FILE", help="also write the raw results as JSON")
    p.add_argument("--keep-logs", metavar="DIR", help="keep the child processes' logs in DIR")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; ``_loadgen`` and ``_gateway`` are internal sub-commands."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_loadgen"]:
        return loadgen_main(argv[1:])
    if argv[:1] == ["_gateway"]:
        return gateway_main(argv[1:])
    if argv[:1] == ["decisions"]:
        from tests.benchmarks.routewise_decisions import main as decisions_main

        return decisions_main(argv[1:])
    if argv[:1] == ["admission"]:
        from tests.benchmarks.limits_admission import main as admission_main

        return admission_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.no_pin:
        args.gateway_cpus = args.load_cpus = None
    elif shutil.which("taskset") is None:
        raise SystemExit("taskset not found (util-linux); install it or pass --no-pin")
    if args.duration <= 0 or args.warmup < 0 or args.repeat < 1:
        raise SystemExit("--duration must be > 0, --warmup >= 0 and --repeat >= 1")
    problem = topology_problem(
        roles=args.roles, cluster=args.cluster, bus=args.bus, workers=args.workers
    )
    if problem:
        raise SystemExit(problem)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    command = shlex.join(["python", "-m", "tests.benchmarks.bench", *argv])
    try:
        results = run(args)
        if args.workers != "1" and "gateway" in args.targets:  # what scaling divides by
            one = argparse.Namespace(**{**vars(args), "workers": "1", "targets": ["gateway"]})
            results = with_baseline(results, run(one))
    except KeyboardInterrupt:
        _log("interrupted; child processes stopped")
        return 130
    except RuntimeError as exc:
        _log(f"failed: {exc}")
        return 1
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    print(f"`{command}`" if args.markdown else command)
    print()
    print(_environment(args))
    print()
    print(report(results, args, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
