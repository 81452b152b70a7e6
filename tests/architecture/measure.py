"""The architecture figures of issue #25, measured: ``python -m tests.architecture.measure``.

* a run-time trace of one non-streamed chat completion through the real server (the default
  engine on loopback, the in-process bus, a fake upstream): ``sys.setprofile`` restricted to
  the task that runs the ASGI app for that request counts the production files it runs
  through, the calls from one production file into another (file switches) and the calls into
  ``gateway/ingress/app.py`` from another file (control re-entering the app module). The HTTP
  server under the app's ASGI ``receive`` and ``send`` is not the app's path and is not
  counted, whichever engine it is: Hypercorn and granian are libraries, and the builtin
  engine's package (:data:`SERVER_PACKAGE`) is traced as one;
* the largest production files (lines);
* production pairs of near-duplicate code of :data:`DUP_LINES`\\ + lines (normalised line
  windows hashed, runs of matching windows merged into one pair);
* the gateway's wings (``gateway/<wing>/``) caught in one import loop (strongly connected
  components of the wing import graph built from the AST).

Production code is :data:`PRODUCTION`. ``tests/architecture/test_figures.py`` checks the figures
against a ratchet and names the goals beside it.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import dis
import hashlib
import re
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import FrameType

REPO = Path(__file__).resolve().parents[2]
PRODUCTION = ("actors", "bus", "gateway", "schemas")
APP_MODULE = "gateway/ingress/app.py"
SERVER_PACKAGE = "gateway/process/h1"
DUP_LINES = 6

__all__ = [
    "DUP_LINES",
    "PRODUCTION",
    "Figures",
    "Trace",
    "duplicate_pairs",
    "import_loops",
    "largest_files",
    "main",
    "measure",
    "production_files",
    "trace_one_request",
    "wing_graph",
]


@dataclass(frozen=True)
class Trace:
    """What one request's task ran through (paths relative to the repository)."""

    files: tuple[str, ...]
    switches: int
    app_reentries: int


@dataclass(frozen=True)
class Figures:
    """The table of issue #25."""

    trace: Trace
    largest: tuple[tuple[str, int], ...]
    duplicate_pairs: int
    wings_in_loop: int
    wings: int


def production_files(root: Path = REPO) -> list[Path]:
    """Every production Python file, sorted."""
    return sorted(p for pkg in PRODUCTION for p in (root / pkg).rglob("*.py"))


def _rel(path: Path | str, root: Path = REPO) -> str:
    return Path(path).resolve().relative_to(root).as_posix()


def largest_files(root: Path = REPO, top: int = 3) -> list[tuple[str, int]]:
    """The ``top`` longest production files as (path, lines)."""
    sizes = [(_rel(p, root), len(p.read_text().splitlines())) for p in production_files(root)]
    return sorted(sizes, key=lambda s: (-s[1], s[0]))[:top]


# ---------------------------------------------------------------------------- near-duplicates

_NUMBER = re.compile(r"\b\d+(\.\d+)?\b")
_WORD = re.compile(r"[A-Za-z_]")


def _skipped_lines(tree: ast.Module) -> set[int]:
    """Lines of docstrings and of import statements (parenthesised name lists included)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                lines.update(range(value.lineno, (value.end_lineno or value.lineno) + 1))
    return lines


def _normalised(text: str) -> list[tuple[int, str]]:
    """(line number, normalised text) of the lines that carry code: docstrings, comments, blank
    lines, imports and punctuation-only lines (closing brackets) are left out, numbers blanked
    and whitespace collapsed."""
    skip = _skipped_lines(ast.parse(text))
    out: list[tuple[int, str]] = []
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if no in skip or not line or line.startswith(("#", "import ", "from ")):
            continue
        if not _WORD.search(line):
            continue
        line = _NUMBER.sub("0", line.split("  #", 1)[0])
        out.append((no, " ".join(line.split())))
    return out


def duplicate_pairs(root: Path = REPO, lines: int = DUP_LINES) -> list[tuple[str, int, str, int]]:
    """Pairs of production code regions whose ``lines``-line normalised windows match, one
    entry (file a, first line, file b, first line) per maximal run of matching windows."""
    windows: dict[str, list[tuple[str, int]]] = defaultdict(list)
    numbers: dict[str, list[int]] = {}
    for path in production_files(root):
        code = _normalised(path.read_text())
        name = _rel(path, root)
        numbers[name] = [no for no, _ in code]
        for i in range(len(code) - lines + 1):
            digest = hashlib.blake2b("\n".join(t for _, t in code[i : i + lines]).encode())
            windows[digest.hexdigest()].append((name, i))
    matches: set[tuple[str, int, str, int]] = set()
    for places in windows.values():
        for a in range(len(places)):
            for b in range(a + 1, len(places)):
                (fa, ia), (fb, ib) = sorted((places[a], places[b]))
                if fa != fb or abs(ia - ib) >= lines:  # a window never duplicates its overlap
                    matches.add((fa, ia, fb, ib))
    # A run of windows along one diagonal is one duplicated region: keep its first window.
    firsts = (m for m in matches if (m[0], m[1] - 1, m[2], m[3] - 1) not in matches)
    return sorted((fa, numbers[fa][ia], fb, numbers[fb][ib]) for fa, ia, fb, ib in firsts)


# ---------------------------------------------------------------------------- import loops


def _imported(node: ast.AST, module: str) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            parts = module.split(".")[: -node.level]
            base = ".".join([*parts, node.module] if node.module else parts)
        else:
            base = node.module or ""
        yield base
        yield from (f"{base}.{a.name}" for a in node.names)


def wing_graph(root: Path = REPO) -> dict[str, set[str]]:
    """``gateway/<wing>/`` -> the other wings it imports (any import, lazy or typing-only)."""
    wings = sorted(p.parent.name for p in (root / "gateway").glob("*/__init__.py"))
    graph: dict[str, set[str]] = {w: set() for w in wings}
    for wing in wings:
        for path in (root / "gateway" / wing).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            module = ".".join(parts if parts[-1] != "__init__" else [*parts[:-1], "x"])
            for node in ast.walk(ast.parse(path.read_text())):
                for name in _imported(node, module):
                    bits = name.split(".")
                    if len(bits) > 1 and bits[0] == "gateway" and bits[1] in graph:
                        if bits[1] != wing:
                            graph[wing].add(bits[1])
    return graph


def import_loops(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one wing (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                loops.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return loops


# ---------------------------------------------------------------------------- run-time trace


_RESUME = dis.opmap["RESUME"]


class _Tracer:
    """A profile hook counting calls between production files within the task that runs the
    app. Only calls count, not returns nor a coroutine resuming after an await (its ``RESUME``
    has a non-zero argument): how often a coroutine waits depends on timing, the calls one
    request makes do not."""

    def __init__(self, root: Path) -> None:
        self._prefixes = tuple(str(root / p) + "/" for p in PRODUCTION)
        self._server = str(root / SERVER_PACKAGE) + "/"
        self._root = str(root) + "/"
        self._app = str(root / APP_MODULE)
        self._task: asyncio.Task[Any] | None = None
        self._cache: dict[str, bool] = {}
        self.files: list[str] = []
        self.switches = 0
        self.app_entries = 0

    def _ours(self, filename: str) -> bool:
        hit = self._cache.get(filename)
        if hit is None:
            hit = self._cache[filename] = filename.startswith(
                self._prefixes
            ) and not filename.startswith(self._server)
        return hit

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        code = frame.f_code
        name = code.co_filename
        at = frame.f_lasti
        if not self._ours(name) or (code.co_code[at] == _RESUME and code.co_code[at + 1]):
            return  # a library's frame, or a coroutine resumed rather than called
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return
        if self._task is None:
            if name != self._app:
                return
            self._task = task
        elif task is not self._task:
            return
        if name not in self.files:
            self.files.append(name)
        caller = frame.f_back
        while caller is not None and not self._ours(caller.f_code.co_filename):
            caller = caller.f_back
        if caller is not None and caller.f_code.co_filename != name:
            self.switches += 1
            self.app_entries += name == self._app

    def trace(self) -> Trace:
        files = tuple(f.removeprefix(self._root) for f in self.files)
        return Trace(files, self.switches, self.app_entries)


async def _trace(root: Path) -> Trace:
    import httpx

    from tests.fixtures.gateway import start_gateway
    from tests.fixtures.upstream import FakeUpstream

    upstream = FakeUpstream("up")
    await upstream.start()
    route = {
        "kind": "openai_compat",
        "base_url": upstream.openai_base_url,
        "provider_model_id": "up-model",
    }
    with tempfile.TemporaryDirectory() as data:
        gw = await start_gateway({"models": [{"id": "m", "route": [route]}]}, data_dir=Path(data))
        try:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                # The first request fills caches and views; the second is the steady state.
                (await client.post("/v1/chat/completions", json=body)).raise_for_status()
                tracer = _Tracer(root)
                sys.setprofile(tracer)
                try:
                    answer = await client.post("/v1/chat/completions", json=body)
                finally:
                    sys.setprofile(None)
                answer.raise_for_status()
        finally:
            await gw.stop()
            await upstream.close()
    return tracer.trace()


def trace_one_request(root: Path = REPO) -> Trace:
    """Run the real server and trace one non-streamed chat completion (in a fresh loop)."""
    return asyncio.run(_trace(root))


async def trace_one_request_async(root: Path = REPO) -> Trace:
    """:func:`trace_one_request` in the running loop."""
    return await _trace(root)


def measure(root: Path = REPO, trace: Trace | None = None) -> Figures:
    """All the figures; the trace runs the server unless one is given."""
    graph = wing_graph(root)
    loops = import_loops(graph)
    return Figures(
        trace=trace or trace_one_request(root),
        largest=tuple(largest_files(root)),
        duplicate_pairs=len(duplicate_pairs(root)),
        wings_in_loop=max((len(c) for c in loops), default=0),
        wings=len(graph),
    )


def main(argv: list[str] | None = None) -> int:
    """Print the table; ``--details`` adds the files, the duplicate pairs and the loops."""
    parser = argparse.ArgumentParser(prog="python -m tests.architecture.measure")
    parser.add_argument("--details", action="store_true")
    args = parser.parse_args(argv)
    figures = measure()
    rows = [
        ("project files one request runs through", str(len(figures.trace.files))),
        ("file switches", str(figures.trace.switches)),
        ("times control re-enters the app module", str(figures.trace.app_reentries)),
        ("largest production files", ", ".join(f"{n} ({p})" for p, n in figures.largest[:2])),
        (
            f"production pairs of near-duplicate code ({DUP_LINES}+ lines)",
            str(figures.duplicate_pairs),
        ),
        ("gateway wings in one import loop", f"{figures.wings_in_loop} of {figures.wings}"),
    ]
    out = sys.stdout
    for label, value in rows:
        out.write(f"| {label} | {value} |\n")
    if args.details:
        out.write("\nfiles: " + " -> ".join(figures.trace.files) + "\n")
        for pair in duplicate_pairs():
            out.write("duplicate: {}:{} ~ {}:{}\n".format(*pair))
        for loop in import_loops(wing_graph()):
            out.write("loop: " + ", ".join(sorted(loop)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
