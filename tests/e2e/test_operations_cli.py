"""Operating real gateway processes: a kill -9 against the request log's documented loss
bound, a clean stop losing nothing, and ``llmgw events``/``admin``/``logs`` from another
process on the same NATS."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import yaml

from gateway.process.config import ConfigError, load_config
from tests.e2e.conftest import CHAT, WAIT, chat, config, eid, model, route
from tests.fixtures.gateway import REPO, GatewayProcess
from tests.fixtures.upstream import FakeUpstream, Reply

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.e2e

_DROPPED = re.compile(r'llmgw_log_rows_dropped_total\{cause="ingress_full"\} (\S+)')
QUEUE_ROWS = 200  # log.queue_rows below: the documented bound on rows a crash loses
PROCESS_WAIT = 30.0  # a CLI process starting Python on a loaded machine


async def _serve(started: list[GatewayProcess], cfg: Path, *args: str) -> GatewayProcess:
    proc = GatewayProcess(["serve", "--config", str(cfg), "--port", "0", *args])
    started.append(proc)
    return await asyncio.to_thread(proc.start)


def _llmgw(*args: str, timeout: float = PROCESS_WAIT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _now_iso() -> str:
    """Now as ``--since`` reads a time (ISO 8601, UTC): plain seconds are a duration ago."""
    return datetime.now(UTC).replace(tzinfo=None).isoformat()


def _request_rows(db: Path) -> list[dict[str, Any]]:
    out = _llmgw(
        "logs", "--db", str(db), "--kind", "request", "--since", "1h", "--limit", "100000", "--json"
    )
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


async def test_kill_9_during_traffic_loses_at_most_the_bound_and_a_clean_stop_loses_nothing(
    processes: list[GatewayProcess],
    tmp_path: Path,
) -> None:
    db = tmp_path / "gw.sqlite3"
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            config(
                model("demo", {"kind": "echo"}),
                database={"path": str(db)},
                log={"batch_rows": 50, "flush_ms": 100, "queue_rows": QUEUE_ROWS},
            )
        )
    )
    proc = await _serve(processes, cfg)
    ok = 0
    dropped_rows = 0.0
    async with httpx.AsyncClient(base_url=proc.url, timeout=WAIT) as client:

        async def traffic() -> None:
            nonlocal ok, dropped_rows
            while True:
                resp = await client.post(CHAT, json=chat("demo"))
                assert resp.status_code == 200
                ok += 1
                if ok == 400:
                    # Rows the outbox dropped while the store lagged are counted, not crash loss.
                    text = (await client.get("/metrics")).text
                    found = _DROPPED.search(text)
                    dropped_rows = float(found.group(1)) if found else 0.0
                    assert proc.proc is not None
                    proc.proc.kill()  # SIGKILL in the middle of the traffic

        results = await asyncio.gather(*(traffic() for _ in range(8)), return_exceptions=True)
    assert all(isinstance(r, httpx.TransportError) for r in results), results
    after_crash = len(_request_rows(db))
    lost = max(0, ok - after_crash)

    proc = await _serve(processes, cfg)  # restarts on the same database
    async with httpx.AsyncClient(base_url=proc.url, timeout=WAIT) as client:
        for _ in range(30):
            assert (await client.post(CHAT, json=chat("demo"))).status_code == 200
    await asyncio.to_thread(proc.stop)  # SIGTERM: a clean stop
    assert proc.proc is not None and proc.proc.returncode == 0

    # Each request has two rows (request, attempt); the others' requests in flight while the
    # metrics were read may have been dropped too.
    dropped = int(dropped_rows) // 2 + 8
    assert 0 < after_crash and lost <= QUEUE_ROWS + dropped, (ok, after_crash, dropped_rows)
    assert len(_request_rows(db)) == after_crash + 30


@pytest.mark.nats
async def test_llmgw_events_sees_a_circuit_open_caused_by_another_process(
    processes: list[GatewayProcess],
    fake_upstream: FakeUpstream,
    nats_url: str,
    tmp_path: Path,
) -> None:
    fake_upstream.set_default(Reply(500))
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            config(
                model("m", route(fake_upstream)), database={"path": str(tmp_path / "gw.sqlite3")}
            )
        )
    )
    proc = await _serve(processes, cfg, "--bus", nats_url)
    tail = await asyncio.to_thread(
        subprocess.Popen,
        [
            sys.executable,
            "-m",
            "gateway.cli.main",
            "events",
            "--filter",
            "circuit",
            "--count",
            "1",
            "--bus",
            nats_url,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert tail.stderr is not None
        following = await asyncio.to_thread(tail.stderr.readline)
        assert following.startswith("llmgw events: following"), following
        async with httpx.AsyncClient(base_url=proc.url, timeout=WAIT) as client:
            for _ in range(2):  # the e2e config's breaker opens after 2 failures
                await client.post(CHAT, json=chat("m"))
        out, err = await asyncio.to_thread(tail.communicate, timeout=PROCESS_WAIT)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()

    assert tail.returncode == 0, err
    event = json.loads(out.splitlines()[0])
    assert (event["kind"], event["type"], event["endpoint"], event["new"]) == (
        "circuit",
        "CircuitTransition",
        eid("m", fake_upstream),
        "open",
    )


@pytest.mark.nats
async def test_llmgw_admin_reload_over_nats_refuses_a_broken_file_as_startup_does(
    processes: list[GatewayProcess],
    nats_url: str,
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "gw.yaml"
    good = config(model("a", {"kind": "echo"}), database={"path": str(tmp_path / "gw.sqlite3")})
    cfg.write_text(yaml.safe_dump(good))
    proc = await _serve(processes, cfg, "--bus", nats_url)
    cfg.write_text(yaml.safe_dump({**good, "models": [{"id": "a", "route": [{"kind": "nope"}]}]}))

    with pytest.raises(ConfigError) as startup:  # what `llmgw serve` prints, after its prefix
        load_config(cfg)
    refused = await asyncio.to_thread(_llmgw, "admin", "reload", "--bus", nats_url)
    cfg.write_text(
        yaml.safe_dump(
            {**good, "models": [*good["models"], {"id": "b", "route": [{"kind": "echo"}]}]}
        )
    )
    reloaded = await asyncio.to_thread(_llmgw, "admin", "reload", "--bus", nats_url)
    async with httpx.AsyncClient(base_url=proc.url, timeout=WAIT) as client:
        # The reply comes once the actors serve b; the ingress swaps on the event it
        # follows, so wait (bounded) until it lists b.
        for _ in range(int(WAIT / 0.01)):
            if "b" in [m["id"] for m in (await client.get("/v1/models")).json()["data"]]:
                break
            await asyncio.sleep(0.01)
        served = await client.post(CHAT, json=chat("b"))
    # Two read-only CLI processes, side by side; the second is a consumer that was away and
    # catches up from the JetStream stream.
    logs, replayed = await asyncio.gather(
        asyncio.to_thread(_llmgw, "logs", "--bus", nats_url, "--model", "b", "--json"),
        asyncio.to_thread(
            _llmgw,
            "events",
            "--since",
            "10m",
            "--filter",
            "config",
            "--count",
            "1",
            "--bus",
            nats_url,
        ),
    )

    message = str(startup.value)
    assert "models[0].route[0].kind" in message
    assert refused.returncode == 1
    assert refused.stderr.strip() == f"llmgw admin: config reload refused: {message}"
    assert reloaded.returncode == 0, reloaded.stderr
    assert json.loads(reloaded.stdout)["added"] == ["b"]
    assert served.status_code == 200, served.text
    assert logs.returncode == 0, logs.stderr
    rows = [json.loads(line) for line in logs.stdout.splitlines()]
    assert [(r["kind"], r["model"], r["status"]) for r in rows] == [
        ("attempt", "b", 200),
        ("request", "b", 200),
    ]
    assert replayed.returncode == 0, replayed.stderr
    event = json.loads(replayed.stdout)
    assert (event["kind"], event["type"]) == ("config", "ConfigChanged")


async def test_sighup_reloads_the_config_file(
    processes: list[GatewayProcess],
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "gw.yaml"
    good = config(model("a", {"kind": "echo"}), database={"path": str(tmp_path / "gw.sqlite3")})
    cfg.write_text(yaml.safe_dump(good))
    proc = await _serve(processes, cfg)
    cfg.write_text(
        yaml.safe_dump(
            {**good, "models": [*good["models"], {"id": "b", "route": [{"kind": "echo"}]}]}
        )
    )
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGHUP)
    async with httpx.AsyncClient(base_url=proc.url, timeout=WAIT) as client:
        for _ in range(int(WAIT / 0.01)):  # no event reaches this test: bounded polling
            if "b" in [m["id"] for m in (await client.get("/v1/models")).json()["data"]]:
                break
            await asyncio.sleep(0.01)
        served = await client.post(CHAT, json=chat("b"))
    assert served.status_code == 200, served.text


@pytest.mark.nats
async def test_a_refused_reload_reads_alike_on_every_route_and_is_logged_once_each(
    processes: list[GatewayProcess],
    nats_url: str,
    tmp_path: Path,
) -> None:
    """Through the local socket and --url the CLI said "refused: HTTP 400: ..." where over the
    bus it said "refused: ..."; a SIGHUP's refusal was logged twice, by the owner's audit
    and by the signal's handler."""
    cfg = tmp_path / "gw.yaml"
    good = config(
        model("a", {"kind": "echo"}),
        admin_key="adm",
        database={"path": str(tmp_path / "gw.sqlite3")},
    )
    cfg.write_text(yaml.safe_dump(good))
    proc = await _serve(processes, cfg, "--bus", nats_url)
    cfg.write_text(yaml.safe_dump({**good, "models": [{"id": "a", "route": [{"kind": "nope"}]}]}))
    with pytest.raises(ConfigError) as startup:
        load_config(cfg)
    message = str(startup.value)
    since = _now_iso()  # the NATS server's events stream outlives each test

    routes = (
        ("--config", str(cfg)),
        ("--url", proc.url, "--admin-key", "adm"),
        ("--bus", nats_url),
    )
    refused = [await asyncio.to_thread(_llmgw, "admin", "reload", *r) for r in routes]
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGHUP)
    audited = await asyncio.to_thread(
        _llmgw, "events", "--since", since, "--filter", "admin", "--count", "4", "--bus", nats_url
    )
    async with httpx.AsyncClient(base_url=proc.url, timeout=WAIT) as client:
        served = await client.post(CHAT, json=chat("a"))
    stderr = await asyncio.to_thread(proc.stop)

    for done in refused:
        assert done.returncode == 1, done.stderr
        assert done.stderr.strip() == f"llmgw admin: config reload refused: {message}"
    events = [json.loads(line) for line in audited.stdout.splitlines()]
    assert [(e["by"], e["ok"]) for e in events] == [
        ("local-cli", False),
        ("http", False),
        ("cli", False),
        ("sighup", False),
    ], audited.stderr
    assert served.status_code == 200, served.text
    logged = [line for line in stderr.splitlines() if message in line]
    assert len(logged) == 4, logged  # one per refusal: three audits, one SIGHUP line
    assert "SIGHUP: config reload refused: " in logged[-1]


@pytest.mark.nats
async def test_sighup_to_an_ingress_reloads_through_the_actors_and_never_alone(
    processes: list[GatewayProcess],
    nats_url: str,
    tmp_path: Path,
) -> None:
    """An ingress re-read its own file on SIGHUP: one the actors refuse (a chain names the
    model it removes) left it answering 404 for a model they still ran, and one they never
    ran (only the ingress signalled) sent it a model they had no actor for."""
    echo = {"kind": "echo"}

    def write(*models: dict[str, Any]) -> None:
        for name in ("actors", "ingress"):
            body = config(*models, database={"path": str(tmp_path / f"{name}.sqlite3")})
            (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(body))

    write(model("a", echo), model("b", echo))
    since = _now_iso()  # the NATS server's events stream outlives each test
    await _serve(processes, tmp_path / "actors.yaml", "--bus", nats_url, "--role", "actors")
    ingress = await _serve(
        processes, tmp_path / "ingress.yaml", "--bus", nats_url, "--role", "ingress"
    )
    assert ingress.proc is not None
    made = await asyncio.to_thread(
        _llmgw, "admin", "chains", "create", "--arg", "name=team", "--arg", 'models=["a","b"]',
        "--bus", nats_url,
    )  # fmt: skip

    async def signalled(count: int) -> list[dict[str, Any]]:
        """SIGHUP the ingress; the config reloads audited by then (``count`` in all)."""
        assert ingress.proc is not None
        ingress.proc.send_signal(signal.SIGHUP)
        done = await asyncio.to_thread(
            _llmgw, "events", "--since", since, "--filter", "admin", "--count", str(count + 1),
            "--bus", nats_url,
        )  # fmt: skip
        return [e for e in map(json.loads, done.stdout.splitlines()) if e["area"] == "config"]

    write(model("a", echo))
    refused = await signalled(1)
    async with httpx.AsyncClient(base_url=ingress.url, timeout=WAIT) as client:
        still = await client.post(CHAT, json=chat("b"))
        write(model("a", echo), model("b", echo), model("c", echo))
        applied = await signalled(2)
        for _ in range(int(WAIT / 0.01)):  # the ingress follows the actors' event: poll it
            if "c" in [m["id"] for m in (await client.get("/v1/models")).json()["data"]]:
                break
            await asyncio.sleep(0.01)
        added = await client.post(CHAT, json=chat("c"))
    stderr = await asyncio.to_thread(ingress.stop)

    assert made.returncode == 0, made.stderr
    assert [(e["by"], e["ok"]) for e in refused] == [("sighup", False)]
    assert still.status_code == 200, still.text
    assert [(e["by"], e["ok"]) for e in applied] == [("sighup", False), ("sighup", True)]
    assert added.status_code == 200, added.text
    assert next(line for line in stderr.splitlines() if "SIGHUP" in line).endswith(
        "(a chain made or edited by an admin command outlives a reload: take the model out "
        "of it first, llmgw admin chains set_models --arg name=team --arg 'models=[\"a\"]')"
    )
