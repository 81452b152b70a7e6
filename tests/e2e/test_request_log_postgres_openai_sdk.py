"""The request log and spend in PostgreSQL (``database.url``) through the real gateway on both
buses: a request from the OpenAI SDK lands there with its cost (not in the SQLite file) and
``log query`` and ``spend report`` read it through the gateway; once no gateway runs,
``llmgw logs`` and ``llmgw admin spend report`` read PostgreSQL itself. The URL's password
never shows."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest
import yaml

from tests.e2e.conftest import WAIT, config, model, route
from tests.e2e.keys_support import ADMIN, admin_http
from tests.fixtures.gateway import REPO, GatewayFactory, RunningGateway, start_gateway

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e

PRICING = {"prompt": 2.0, "completion": 10.0}
COST = (10 * 2.0 + 5 * 10.0) / 1e6  # the fake upstream reports 10 prompt, 5 completion tokens
SECRET = "pg-s3cret-password"  # trust authentication ignores it; it must never be shown


def _with_password(url: str) -> str:
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@")


async def _admin(gw: RunningGateway, area: str, verb: str, **args: Any) -> Any:
    resp = await admin_http(gw).post(f"/admin/{area}/{verb}", json=args)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _llmgw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=WAIT * 6,
        check=False,
    )


async def _postgres_rows(url: str) -> list[dict[str, Any]]:
    con = await asyncpg.connect(url)
    try:
        rows = await con.fetch("SELECT kind, request_id, cost_usd FROM request_log ORDER BY id")
        spend = await con.fetchval("SELECT SUM(cost_usd) FROM spend_hourly")
    finally:
        await con.close()
    return [{**dict(r), "spend_hourly_usd": spend} for r in rows]


def _config(up: FakeUpstream, tmp_path: Path, postgres_url: str) -> dict[str, Any]:
    database = {"path": str(tmp_path / "gw.sqlite3"), "url": _with_password(postgres_url)}
    return config(model("m", route(up, pricing=PRICING)), database=database, admin_key=ADMIN)


async def test_a_request_with_database_url_lands_in_postgres_with_its_cost(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    postgres_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    cfg = _config(fake_upstream, tmp_path, postgres_url)
    gw = await gateway_factory(cfg)

    answer = await gw.openai().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    (row,) = (await _admin(gw, "log", "query", kind="request"))["rows"]
    spend = await _admin(gw, "spend", "report", group_by="model", since=0)
    stored = await _postgres_rows(postgres_url)

    assert answer.choices[0].message.content
    assert row["cost_usd"] == pytest.approx(COST) and row["model"] == "m"
    assert spend["total_usd"] == pytest.approx(COST) and spend["groups"][0]["requests"] == 1
    # In PostgreSQL: the request's two rows (attempt, request) and its hour's spend.
    assert sorted(r["kind"] for r in stored) == ["attempt", "request"]
    assert {r["request_id"] for r in stored} == {row["request_id"]}
    assert all(r["cost_usd"] == pytest.approx(COST) for r in stored)
    assert stored[0]["spend_hourly_usd"] == pytest.approx(COST)
    with sqlite3.connect(cfg["database"]["path"]) as db:  # keys and state, not the log
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
    assert "request_log" not in tables and "spend_hourly" not in tables
    assert "PostgreSQL postgresql://postgres:***@" in caplog.text
    assert SECRET not in caplog.text


async def test_logs_and_spend_report_read_postgres_once_no_gateway_runs(
    fake_upstream: FakeUpstream, postgres_url: str, tmp_path: Path
) -> None:
    cfg = _config(fake_upstream, tmp_path, postgres_url)
    cli_config = tmp_path / "cli.yaml"
    cli_config.write_text(yaml.safe_dump({"database": cfg["database"]}))
    gw = await start_gateway(cfg, data_dir=tmp_path)
    try:
        client = gw.openai()
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    finally:
        await gw.stop()  # no gateway answers here any more: the CLI reads PostgreSQL

    logs, spend = await asyncio.gather(
        asyncio.to_thread(_llmgw, "logs", "--config", str(cli_config), "--json"),
        asyncio.to_thread(
            _llmgw, "admin", "spend", "report", "--config", str(cli_config), "--json", "{}"
        ),
    )

    assert logs.returncode == 0, logs.stderr
    got = [json.loads(line) for line in logs.stdout.splitlines()]
    assert [r["kind"] for r in got] == ["attempt", "request"]
    assert got[1]["cost_usd"] == pytest.approx(COST)
    assert spend.returncode == 0, spend.stderr
    report = json.loads(spend.stdout)
    assert report["total_usd"] == pytest.approx(COST)
    assert [(g["model"], g["requests"]) for g in report["groups"]] == [("m", 1)]
    assert SECRET not in logs.stderr + logs.stdout + spend.stderr + spend.stdout


def test_logs_with_an_unreachable_postgres_says_so_in_one_line_without_the_password(
    tmp_path: Path,
) -> None:
    cli_config = tmp_path / "cli.yaml"
    url = f"postgresql://gw:{SECRET}@127.0.0.1:9/llmgw"  # port 9: nothing listens
    database = {"path": str(tmp_path / "gw.sqlite3"), "url": url}
    cli_config.write_text(yaml.safe_dump({"database": database}))

    done = _llmgw("logs", "--config", str(cli_config))

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and SECRET not in done.stderr + done.stdout
    assert done.stderr.startswith("llmgw logs: cannot read the request log: postgresql://gw:***@")
