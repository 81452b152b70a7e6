"""``llmgw serve`` as a real process: the bundled demo config, flags, the ready line, and
configuration errors (exit code 2, one message naming file, key path and reason)."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
from typing import TYPE_CHECKING

import openai
import pytest
import yaml

from gateway.cli import main as cli
from tests.e2e.conftest import HI, config, eid, model, route
from tests.fixtures.gateway import REPO, GatewayProcess

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e

READY = re.compile(r"^llmgw listening on http://(?P<host>[^:/]+):(?P<port>\d+)$")


async def _start(args: list[str], env: dict[str, str] | None = None) -> GatewayProcess:
    return await asyncio.to_thread(GatewayProcess(args, env).start)


async def _stop(proc: GatewayProcess) -> tuple[int | None, str]:
    err = await asyncio.to_thread(proc.stop)
    assert proc.proc is not None
    return proc.proc.returncode, err


def _openai(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)


async def test_cli_serve_without_config_serves_demo_on_echo_streaming_too(bus_url: str) -> None:
    proc = await _start(["serve", "--port", "0", "--bus", bus_url])
    try:
        ready = READY.match(proc.ready_line)
        assert ready is not None, proc.ready_line
        assert ready["host"] == "127.0.0.1" and int(ready["port"]) > 0
        async with _openai(proc.url) as client:
            # The ready line is printed once the gateway answers: no retry needed.
            answer = await client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "hello there"}]
            )
            stream = await client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "hello there"}], stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            models = await client.models.list()
    finally:
        code, err = await _stop(proc)

    assert answer.model == "demo"
    assert answer.choices[0].message.content == "echo: hello there"
    assert text == "echo: hello there"
    assert [m.id for m in models.data if not m.id.startswith("auto")] == ["demo"]
    assert code == 0, err
    assert "Traceback" not in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_cli_serve_with_config_host_and_port_listens_there(
    tmp_path: Path,
    fake_upstream: FakeUpstream,
) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            config(model("m", route(fake_upstream)), server={"host": "0.0.0.0", "port": 1})
        )
    )
    port = _free_port()

    proc = await _start(["serve", "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)])
    try:
        async with _openai(proc.url) as client:
            raw = await client.chat.completions.with_raw_response.create(model="m", messages=HI)
    finally:
        code, err = await _stop(proc)

    assert proc.ready_line == f"llmgw listening on http://127.0.0.1:{port}"
    assert raw.parse().choices[0].message.content == "Hello from up1."
    assert raw.headers["x-routed-via"] == eid("m", fake_upstream)
    assert code == 0, err


async def test_cli_with_invalid_config_exits_2_naming_file_key_path_and_reason(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "broken.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "models": [
                    {"id": "a", "route": [{"kind": "echo"}]},
                    {"id": "b", "route": [{"kind": "echo"}]},
                    {"id": "c", "route": [{"kind": "echo", "weight": "heavy"}]},
                ]
            }
        )
    )

    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gateway.cli.main", "serve", "--config", str(cfg), "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"llmgw: invalid configuration: {cfg}: models[2].route[0].weight: ")
    assert "number" in lines[0]
    assert "Traceback" not in done.stderr


CONFIG_ERRORS = {
    "unknown_key": (
        "models: [{id: a, route: [{kind: echo, wieght: 1}]}]",
        "models[0].route[0].wieght: Extra inputs are not permitted",
    ),
    "unknown_top_level_key": ("modles: []\n", "modles: Extra inputs are not permitted"),
    "wrong_type": ("server: {port: eighty}\n", "server.port: "),
    "missing_env_var": (
        "models: [{id: a, route: [{kind: openai_compat, "
        "base_url: 'http://x/v1', api_key: '${LLMGW_E2E_UNSET_VAR}'}]}]",
        "models[0].route[0].api_key: environment variable LLMGW_E2E_UNSET_VAR is not set",
    ),
    "unknown_kind": ("models: [{id: a, route: [{kind: grpc}]}]", "models[0].route[0].kind: "),
    "unknown_router": (
        "models: [{id: a, router: fastest, route: [{kind: echo}]}]",
        "models[0].router: unknown router 'fastest'",
    ),
}


@pytest.mark.parametrize(("text", "expected"), CONFIG_ERRORS.values(), ids=CONFIG_ERRORS.keys())
def test_cli_main_with_config_error_returns_2_with_one_precise_message(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    text: str,
    expected: str,
) -> None:
    monkeypatch.delenv("LLMGW_E2E_UNSET_VAR", raising=False)
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(text)

    code = cli.main(["serve", "--config", str(cfg), "--port", "0"])

    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(f"llmgw: invalid configuration: {cfg}: {expected}"), err


def test_cli_main_with_unreadable_config_returns_2_naming_the_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    missing = tmp_path / "nope.yaml"

    code = cli.main(["serve", "--config", str(missing)])

    assert code == 2
    assert f"{missing}: cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("role", ["ingress", "actors"])
def test_cli_main_split_role_on_inproc_bus_returns_2(
    role: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli.main(["serve", "--role", role, "--bus", "inproc://", "--port", "0"])

    assert code == 2
    assert "needs a shared bus" in capsys.readouterr().err


def test_cli_main_actors_with_an_unusable_node_id_returns_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["serve", "--role", "actors", "--bus", "nats://127.0.0.1:1", "--node-id", "a b"]
    code = cli.main(argv)

    assert code == 2
    assert "--node-id 'a b'" in capsys.readouterr().err


def test_cli_parser_accepts_the_serve_synopsis() -> None:
    args = cli._parser().parse_args(
        [
            "serve",
            "--config",
            "gw.yaml",
            "--host",
            "::1",
            "--port",
            "0",
            "--bus",
            "nats://127.0.0.1:4222",
            "--role",
            "ingress",
        ]
    )

    assert (args.config, args.host, args.port, args.bus, args.role) == (
        "gw.yaml",
        "::1",
        0,
        "nats://127.0.0.1:4222",
        "ingress",
    )
    assert cli._parser().parse_args(["serve"]).role == "all"
