"""Traces: the requests a replay sends, one JSON object a line.

A trace line is a :class:`TraceRequest`, or a :class:`TraceKey` (``"kind": "key"``): a
gateway API key the requests naming it present, with its role and limits. A trace comes
from ``llmgw replay synth`` or from the gateway's own request log (``llmgw logs --json``):
:func:`read_trace` takes either, a request-log row being recognised by its
``requested_model`` field (each request is replayed once, and routed afresh); its size is
that of the attempt that served it, from the ``attempt`` rows when they are there (a request
row's tokens are all its attempts', a hedged or failed-over request's more than it asked),
else the request row's; :func:`read_keys` reads the key lines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import msgspec

from schemas.limits import LimitSpec

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

_DEFAULT_OUTPUT_TOKENS = 200  # a logged failure reports no completion: assume a typical one


class TraceRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One request: when it arrives (seconds from the trace's start), what it asks and who
    asks. ``labels`` go out as the ``x-llmgw-metadata`` header (for routing rules);
    ``tools`` function definitions go with it, and ``tool_call`` makes its answer a call of
    one (``tool_choice: required``); ``images`` image parts follow its text (modality
    routing); ``key`` names the gateway API key it presents ("": anonymous). ``max_tokens``
    is the cap its client sets (0: none; None: the answer's length, so the cap says it; a
    larger cap is what providers reserve of a token limit while the answer runs)."""

    id: str
    t: float
    model: str
    prompt_tokens: int = 100
    output_tokens: int = _DEFAULT_OUTPUT_TOKENS
    stream: bool = True
    caller: str = "c0"
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    tools: int = 0
    tool_call: bool = False
    images: int = 0
    key: str = ""
    max_tokens: int | None = None


class TraceKey(msgspec.Struct, frozen=True, kw_only=True, tag="key", tag_field="kind"):
    """A gateway API key of the trace: the replay creates it (``org``, user ``name``,
    ``role``) with ``limits`` before the traffic. A key a request names that no line declares
    is created with role ``free`` and no limits."""

    name: str
    role: Literal["free", "pro", "internal", "admin"] = "free"
    org: str = "replay"
    limits: LimitSpec | None = None


_encode = msgspec.json.Encoder().encode
_decode_line = msgspec.json.Decoder(dict[str, Any]).decode


def write_trace(
    path: str | Path, requests: Iterable[TraceRequest], keys: Iterable[TraceKey] = ()
) -> int:
    """Write ``keys`` then ``requests`` as JSON lines; returns how many requests. Raises
    OSError."""
    n = 0
    with open(path, "wb") as fh:
        for k in keys:
            fh.write(_encode(k) + b"\n")
        for r in requests:
            fh.write(_encode(r) + b"\n")
            n += 1
    return n


def read_trace(path: str | Path) -> list[TraceRequest]:
    """The trace at ``path`` (a replay trace or request-log JSON lines), ordered by arrival.
    Raises OSError, or ValueError naming the first line that is neither."""
    out: list[TraceRequest] = []
    attempts: list[dict[str, Any]] = []
    with open(path, "rb") as fh:
        lines = [(i, line) for i, line in enumerate(fh, 1) if line.strip()]
    rows: list[tuple[int, dict[str, Any]]] = []
    for i, line in lines:
        try:
            row = _decode_line(line)
        except msgspec.DecodeError as exc:
            raise ValueError(f"{path}:{i}: not a JSON object: {exc}") from None
        if row.get("kind") not in ("attempt", "key"):
            rows.append((i, row))
        elif row.get("kind") == "attempt":
            attempts.append(row)
    logged = [(i, row) for i, row in rows if "requested_model" in row]
    start, served = _start(row for _, row in logged), _served(attempts)
    for i, row in rows:
        try:
            if "requested_model" in row:
                out.append(_from_log(i, row, start, served))
            else:
                out.append(msgspec.convert(row, TraceRequest))
        except (msgspec.ValidationError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{i}: not a trace request: {exc}") from None
    out.sort(key=lambda r: (r.t, r.id))
    return out


def trace_from_log(rows: Iterable[dict[str, Any]]) -> list[TraceRequest]:
    """Request-log rows (the log owner's ``log query`` answers) as a trace: their request
    rows, ordered by arrival, each the size of its attempt row that served it (when given).
    Raises ValueError naming the first that is not one."""
    rows = list(rows)
    logged = [row for row in rows if row.get("kind") != "attempt"]
    start, served = _start(logged), _served(r for r in rows if r.get("kind") == "attempt")
    out: list[TraceRequest] = []
    for n, row in enumerate(logged, 1):
        try:
            out.append(_from_log(n, row, start, served))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"request-log row {n}: not a request: {exc!r}") from None
    out.sort(key=lambda r: (r.t, r.id))
    return out


def read_keys(path: str | Path) -> list[TraceKey]:
    """The key lines of the trace at ``path``, in file order. Raises OSError, or ValueError
    naming the first key line that is not one."""
    out: list[TraceKey] = []
    with open(path, "rb") as fh:
        for i, line in enumerate(fh, 1):
            if b'"kind"' not in line:
                continue  # cheap: a synthesized request line has no kind
            try:
                row = _decode_line(line)
            except msgspec.DecodeError:
                continue  # read_trace names it
            if row.get("kind") == "key":
                try:
                    key = msgspec.convert(row, TraceKey)
                except msgspec.ValidationError as exc:
                    raise ValueError(f"{path}:{i}: not a trace key: {exc}") from None
                problems = key.limits.problems() if key.limits is not None else []
                if problems:
                    raise ValueError(f"{path}:{i}: the key's limits: {'; '.join(problems)}")
                out.append(key)
    return out


def _start(rows: Iterable[dict[str, Any]]) -> float:
    """The first arrival among logged rows (0 without any)."""
    return min((_arrival(row) for row in rows), default=0.0)


def _arrival(row: dict[str, Any]) -> float:
    """A logged request's arrival, Unix seconds (``ts`` is when it ended)."""
    return float(row.get("ts") or 0.0) - float(row.get("latency_ms") or 0.0) / 1000.0


def _served(attempts: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each request's attempt row that served it (its success, else its last), by id."""
    out: dict[str, dict[str, Any]] = {}
    ordered = sorted(attempts, key=lambda r: (r.get("outcome") == "success", r.get("attempt") or 0))
    for row in ordered:
        out[str(row.get("request_id"))] = row  # a success sorts last, so it stays
    return out


def _from_log(
    line: int, row: dict[str, Any], start: float, served: dict[str, dict[str, Any]]
) -> TraceRequest:
    """A request-log row as the request it was (the size of ``served``'s attempt for it)."""
    sized = served.get(str(row.get("request_id")), row)
    return TraceRequest(
        id=str(row.get("request_id") or f"log-{line}"),
        t=round(_arrival(row) - start, 6),
        model=str(row["requested_model"]),
        prompt_tokens=int(sized.get("prompt_tokens") or 0) or 1,
        output_tokens=int(sized.get("completion_tokens") or 0) or _DEFAULT_OUTPUT_TOKENS,
        stream=bool(row.get("stream", False)),
        caller=str(row.get("caller_id") or row.get("caller") or "c0"),
        key=str(row.get("key_id") or ""),
    )
