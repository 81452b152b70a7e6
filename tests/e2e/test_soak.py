"""Soak: 1,000 requests through routes that fail at random, on the in-process bus.

Two models, one streamed and one not, each with three flaky routes (two upstream keys each)
and one healthy route, all of equal weight. Each flaky upstream answers from a seeded script
in which 30% of answers fail: 429 with Retry-After, 500, 503, a connection reset, silence
before the first byte (caught by the TTFT timeout on streams, the request timeout otherwise)
and, on the non-streamed model, a body that stops half way. Circuits, benches with their
background probes, key mutes and degraded mode all trip and recover many times during the run.

A stream that stalls after its first chunk is left out on purpose: by design it ends with an
error event (``test_failover_openai_sdk``), so it cannot be part of "no client sees an error".

Claims: every client request succeeds; the request log (the StoreActor's SQLite table, read
after a clean stop) accounts for every attempt: one request row per client request naming
its number of attempts, one attempt row per attempt numbered 1..n with failures then the one
success, and, request by request, every request an upstream received has its attempt row (an
attempt row with no upstream request is a key-pool refusal, which sends nothing, or an
attempt given up on by a timeout before the upstream read it); and the flaky routes keep
coming back to the end of the run (this caught degraded mode never ending, see
``actors/degraded.is_healthy``).

It starts its own gateway (``start_gateway``) rather than the two-bus ``gateway_factory``: one
run is the point, and NATS adds nothing the other e2e files do not already prove. The clients
run in a child process so that they do not share one core with the gateway and upstreams.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import sys
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import route
from tests.fixtures.gateway import start_gateway
from tests.fixtures.upstream import Behaviour, FakeUpstream, Hang, Reply, Reset, Stream

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.e2e

# 1,000 requests already fail every scripted way dozens of times when run alone (each kind
# 20 to 40 times); 3,000 proved nothing more and took three times as long. Under CI's four
# workers on two cores fewer attempts reach the flaky routes (one run saw a kind only 9
# times), so a run must see each kind a few times, not merely once, and not a count that
# only an idle machine reaches.
REQUESTS = 1_000
MANY = 3  # failures of each scripted kind a run must see
CONCURRENCY = 32
FAILURE_SHARE = 0.3
SEED = 20_240_601

_COMMON: list[Behaviour] = [
    Reply(429, headers={"Retry-After": "1"}),
    Reply(500),
    Reply(503),
    Reset(),
    Hang(),
]
FAILURES = {
    "stream": [*_COMMON, Stream(first_byte_delay=5.0)],
    "once": [*_COMMON, Stream(stall_after=1, chunks=3)],
}
# Short limits keep a silent attempt cheap; a healthy answer takes milliseconds.
FLAKY_LIMITS = {"ttft_timeout_seconds": 0.2, "idle_timeout_seconds": 0.5, "timeout_seconds": 0.3}


def _script(rng: random.Random, failures: list[Behaviour], n: int) -> list[Behaviour]:
    return [rng.choice(failures) if rng.random() < FAILURE_SHARE else Reply() for _ in range(n)]


def _config(routes: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        "routing": {
            "affinity": {"enabled": False},
            "failover": {"max_attempts": 20, "budget_seconds": 10},
            "circuit": {"failure_threshold": 3, "cooldown_seconds": 0.5},
            "bench": {
                "failures": 5,
                "window_seconds": 1.0,
                "duration_seconds": 0.4,
                "probe_after_fraction": 0.5,
                "probe_max_interval_seconds": 0.5,  # a benched route's probes stay close
            },
            "key_pool": {"mute_seconds": 0.2},
            "degraded": {
                "threshold": 0.5,
                "entry_seconds": 0.3,
                "exit_seconds": 0.6,
                "pass_interval_seconds": 0.1,
            },
        },
        "log": {"queue_rows": 100_000},
        "events": {"decisions": False, "stream": False},
        "models": [{"id": name, "route": r} for name, r in routes.items()],
    }


_CLIENTS = r"""
import asyncio, json, sys, time
import httpx

async def main(url: str, n: int, concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        async def one(i: int) -> None:
            kind = "stream" if i % 2 else "once"
            body = {"model": kind, "messages": [{"role": "user", "content": f"soak {i}"}],
                    "stream": kind == "stream"}
            async with gate:
                resp = await client.post("/v1/chat/completions", json=body)
            text = resp.text
            ok = resp.status_code == 200 and (
                text.endswith("data: [DONE]\n\n") and '"error"' not in text
                if kind == "stream" else "choices" in resp.json())
            error = "" if ok else f"{kind}: {resp.status_code} {text[:300]}"
            print(json.dumps({"i": i, "request_id": resp.headers.get("x-request-id"),
                              "error": error}))

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        print(time.perf_counter() - started)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""
"""The client side: ``n`` requests, alternately non-streamed and streamed, ``concurrency`` at
a time; one JSON line per request (its number, the gateway's request id, the error if any),
then the seconds it all took. A stream succeeds only with ``[DONE]`` and no error event."""


def _client_number(body: Any) -> int | None:
    """Which client request an upstream request carried (None for a background probe)."""
    try:
        text = body["messages"][0]["content"]
    except (KeyError, IndexError, TypeError):
        return None
    return int(text.removeprefix("soak ")) if text.startswith("soak ") else None


# Attempts the gateway gave up on in time; under a starved CPU such an attempt can end before
# the upstream has read the request, so the upstream never counts it.
_SILENT = frozenset({"ttft", "timeout", "budget"})


@pytest.mark.timeout(180)
async def test_soak_random_upstream_failures_no_client_error_and_log_accounts_every_attempt(
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    ups: dict[str, list[FakeUpstream]] = {}
    routes: dict[str, list[dict[str, Any]]] = {}
    for kind in ("stream", "once"):
        # One content chunk per answer: the soak is about attempts, not about relaying.
        flaky = [await FakeUpstream(f"{kind}-flaky{i}", chunks=1).start() for i in range(3)]
        healthy = await FakeUpstream(f"{kind}-healthy", chunks=1).start()
        for i, up in enumerate(flaky):
            up.enqueue(*_script(rng, FAILURES[kind], REQUESTS))
            # Two keys each, so a failure mutes one and the route carries on with the other.
            routes.setdefault(kind, []).append(
                route(up, api_keys=[f"sk-{kind}-{i}-a", f"sk-{kind}-{i}-b"], **FLAKY_LIMITS)
            )
        routes[kind].append(route(healthy))
        ups[kind] = [*flaky, healthy]
    everyone = [up for group in ups.values() for up in group]
    gw = await start_gateway(_config(routes), "inproc://", data_dir=tmp_path)
    try:
        # The clients run in a process of their own: this one has the gateway and upstreams.
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _CLIENTS,
            gw.url,
            str(REQUESTS),
            str(CONCURRENCY),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
    finally:
        await gw.stop()  # a clean stop commits every row of the request log
        for up in everyone:
            await up.close()

    assert proc.returncode == 0, err.decode()[-2000:]
    *lines, summary = out.decode().splitlines()
    results = [json.loads(line) for line in lines]
    assert float(summary) > 0  # the clients' own seconds, printed last
    errors = [r["error"] for r in results if r["error"]]
    request_ids = {r["i"]: r["request_id"] for r in results if not r["error"]}
    assert errors == [], f"{len(errors)} client errors, first: {errors[:3]}"
    assert len(request_ids) == REQUESTS
    db = sqlite3.connect(tmp_path / "llmgw.sqlite3")
    try:
        requests = db.execute(
            "SELECT request_id, status, outcome, attempt, endpoint FROM request_log"
            " WHERE kind = 'request'"
        ).fetchall()
        attempts = db.execute(
            "SELECT request_id, attempt, outcome, endpoint, error_kind FROM request_log"
            " WHERE kind = 'attempt' ORDER BY ts"
        ).fetchall()
    finally:
        db.close()

    # One request row per client request, each a success naming its number of attempts.
    assert len(requests) == REQUESTS
    assert {row[0] for row in requests} == set(request_ids.values())
    assert {(status, outcome) for _, status, outcome, _, _ in requests} == {(200, "success")}
    # One attempt row per attempt: numbered 1..n, failures then the one success.
    by_request: dict[str, list[tuple[int, str, str, str]]] = defaultdict(list)
    for rid, n, outcome, endpoint, error_kind in attempts:
        by_request[rid].append((n, outcome, endpoint, error_kind))
    assert set(by_request) == set(request_ids.values())
    for rid, _, _, n_attempts, endpoint in requests:
        rows = sorted(by_request[rid])
        assert [r[0] for r in rows] == list(range(1, n_attempts + 1)), rows
        assert [r[1] for r in rows] == ["failure"] * (n_attempts - 1) + ["success"], rows
        assert rows[-1][2] == endpoint, rows
    # Against what the upstreams saw, request by request: every request an upstream received
    # has its attempt row; an attempt row without one sent nothing (a key-pool refusal) or
    # was given up before the upstream read it.
    endpoint_of = {id(up): f"{kind}:local-{up.port}" for kind, group in ups.items() for up in group}
    received: dict[str, Counter[str]] = defaultdict(Counter)
    for up in everyone:
        for rec in up.requests:
            n = _client_number(rec.json)
            if n is not None:
                received[request_ids[n]][endpoint_of[id(up)]] += 1
    for rid, rows in by_request.items():
        logged = Counter(endpoint for _, _, endpoint, _ in rows)
        assert received[rid] <= logged, (rid, received[rid], rows)
        for endpoint, n in (logged - received[rid]).items():
            unsent = sum(
                1
                for _, _, e, kind in rows
                if e == endpoint and (kind == "key_pool_exhausted" or kind in _SILENT)
            )
            assert unsent >= n, (rid, rows)
    # The run was a soak, not a walk: attempts failed, in every way scripted.
    failure_kinds = Counter(
        kind
        for _, outcome, _, kind in (r for rows in by_request.values() for r in rows)
        if outcome == "failure"
    )
    assert sum(failure_kinds.values()) > REQUESTS * 0.05, failure_kinds
    scripted = ("http_429", "http_500", "http_503", "transport", "ttft")
    assert all(failure_kinds[kind] >= MANY for kind in scripted), failure_kinds
    # Flaky routes kept coming back (benches lifted, circuits closed, degraded mode left):
    # every one of them still took attempts in the last third of the run. A route can be out
    # for about a second at a time as designed (a circuit open 0.5 s, then a probe that fails
    # 30 % of the time opens it again), and the run is about four seconds: a fifth of it
    # missed such an outage now and then under a loaded CI.
    flaky_endpoints = {f"{kind}:local-{up.port}" for kind, group in ups.items() for up in group[:3]}
    late = {endpoint for _, _, _, endpoint, _ in attempts[-len(attempts) // 3 :]}
    assert late >= flaky_endpoints, late
