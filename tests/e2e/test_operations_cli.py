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
