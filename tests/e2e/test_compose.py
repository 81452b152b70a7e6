"""compose.yaml: no container engine runs here, so its structure is checked and each gateway
command is parsed by the CLI's own argument parser (what the container would run)."""

from __future__ import annotations

import http.server
import json
import re
import shlex
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.admin.local_socket import socket_path
from gateway.cli import main as cli
from gateway.process.config import load_config
from tests.fixtures.gateway import REPO

if TYPE_CHECKING:
    import argparse

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    assert isinstance(compose, dict)
    return dict(compose["services"])


def _llmgw_argv(command: Any) -> list[str]:
    """The ``llmgw ...`` argv a service runs (through ``sh -c`` and ``exec`` if present)."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if argv[:2] == ["sh", "-c"]:
        steps = [shlex.split(step) for step in argv[2].split("&&")]
        runs = [s for s in steps if "llmgw" in s]
        assert len(runs) == 1, argv
        argv = runs[0]
    if argv[0] == "exec":
        argv = argv[1:]
    assert argv[0] == "llmgw", argv
    return argv[1:]


def _nats(services: dict[str, Any]) -> dict[str, Any]:
    return {n: s for n, s in services.items() if str(s.get("image", "")).startswith("nats")}


def _postgres(services: dict[str, Any]) -> dict[str, Any]:
    return {n: s for n, s in services.items() if str(s.get("image", "")).startswith("postgres")}


def _gateway_args(services: dict[str, Any]) -> dict[str, argparse.Namespace]:
    return {
        name: cli._parser().parse_args(_llmgw_argv(svc["command"]))
        for name, svc in services.items()
        if name not in _nats(services) and name not in _postgres(services)
    }


def test_compose_has_a_nats_cluster_two_actors_hosts_and_two_ingress_services(
    services: dict[str, Any],
) -> None:
    args = _gateway_args(services)
    roles = sorted(a.role for a in args.values())
    nats = _nats(services)

    assert len(nats) == 3
    names = set()
    for svc in nats.values():
        command = svc["command"]
        assert "-js" in command and "--cluster_name" in command and "--routes" in command
        names.add(command[command.index("--server_name") + 1])  # JetStream needs one each
    assert len(names) == 3
    assert roles == ["actors", "actors", "ingress", "ingress"]
    assert all(a.command == "serve" for a in args.values())
    node_ids = [a.node_id for a in args.values() if a.role == "actors"]
    assert None not in node_ids and len(set(node_ids)) == 2


def test_compose_gateway_commands_share_the_nats_service_bus_and_config(
    services: dict[str, Any],
) -> None:
    args = _gateway_args(services)

    for name, a in args.items():
        servers = [urlsplit(u) for u in a.bus.split(",")]
        assert {(u.scheme, u.hostname, u.port) for u in servers} == {
            ("nats", n, 4222) for n in _nats(services)
        }, name
        assert a.config is not None, name
        mounts = [str(v).split(":")[1] for v in services[name].get("volumes", [])]
        assert a.config in mounts, (name, a.config, mounts)
        assert "nats" in services[name].get("depends_on", []), name


def test_compose_ingress_services_listen_on_all_interfaces_on_their_published_port(
    services: dict[str, Any],
) -> None:
    ingress = {n: a for n, a in _gateway_args(services).items() if a.role == "ingress"}
    published: list[str] = []

    for name, a in ingress.items():
        assert a.host == "0.0.0.0", name
        ports = [str(p).split(":") for p in services[name]["ports"]]
        assert [container for _, container in ports] == [str(a.port)], name
        published.extend(host for host, _ in ports)
        assert any(d.startswith("actors") for d in services[name]["depends_on"]), name

    assert len(set(published)) == len(published) == 2


def test_compose_actors_service_serves_no_http(services: dict[str, Any]) -> None:
    for actors in [n for n, a in _gateway_args(services).items() if a.role == "actors"]:
        assert "ports" not in services[actors]


def test_compose_commands_are_the_scaled_out_commands_the_readme_documents(
    services: dict[str, Any],
) -> None:
    readme = (REPO / "README.md").read_text()
    documented = [
        cli._parser().parse_args(shlex.split(cmd)[1:])
        for cmd in re.findall(r"`(llmgw serve [^`\n]*--role [^`\n]*)`", readme)
    ]
    by_role = {a.role: a for a in documented}

    assert sorted(by_role) == ["actors", "ingress"]
    for name, a in _gateway_args(services).items():
        doc = by_role[a.role]
        first = a.bus.split(",")[0]
        assert (urlsplit(first).scheme, urlsplit(first).port) == (
            urlsplit(doc.bus).scheme,
            urlsplit(doc.bus).port,
        ), name


# -- what makes `docker compose up` work as shipped ---------------------------------------------

READY_PATH = "/health/ready"
COMPOSE_HOST_DIR = "."  # compose.yaml's relative paths are relative to its own directory


def _sources_of(svc: dict[str, Any]) -> dict[str, str]:
    """Container path -> host source of a service's volumes."""
    return {str(v).split(":")[1]: str(v).split(":")[0] for v in svc.get("volumes", [])}


def _dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (INSTRUCTION, arguments), continuation lines joined."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def test_compose_services_each_have_an_image_a_restart_policy_and_no_runtime_install(
    services: dict[str, Any],
) -> None:
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        assert svc.get("restart") in ("always", "unless-stopped", "on-failure"), name
        assert "pip" not in " ".join(map(str, svc.get("command", []))), name
        assert not any(src in (".", "./") for src in _sources_of(svc).values()), name
    for name in _gateway_args(services):
        assert services[name]["build"] == COMPOSE_HOST_DIR, name
    assert (REPO / COMPOSE_HOST_DIR / "Dockerfile").is_file()


def test_compose_dependencies_wait_for_health_and_each_dependency_checks_its_health(
    services: dict[str, Any],
) -> None:
    for name in _gateway_args(services):
        depends = services[name]["depends_on"]
        assert isinstance(depends, dict), name
        for dep, how in depends.items():
            assert how == {"condition": "service_healthy"}, (name, dep)
            assert services[dep]["healthcheck"]["test"][0] == "CMD", dep


def test_compose_ingress_healthchecks_ask_readiness_with_the_image_own_python(
    services: dict[str, Any],
) -> None:
    ingress = {n: a for n, a in _gateway_args(services).items() if a.role == "ingress"}

    for name, a in ingress.items():
        test = services[name]["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"], name
        compile(test[3], f"{name} healthcheck", "exec")
        assert f"'http://127.0.0.1:{a.port}{READY_PATH}'" in test[3], name


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False)])
def test_compose_ingress_healthcheck_command_passes_only_when_ready_answers_200(
    services: dict[str, Any],
    status: int,
    healthy: bool,
) -> None:
    asked: list[str] = []

    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    code = services["ingress-1"]["healthcheck"]["test"][3].replace(
        "127.0.0.1:8080", f"127.0.0.1:{server.server_address[1]}"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, timeout=30, check=False
        )
    finally:
        server.shutdown()
        server.server_close()

    assert asked == [READY_PATH]
    assert (done.returncode == 0) is healthy, done.stderr


def test_compose_actors_healthcheck_asks_the_actors_on_the_socket_beside_their_database(
    services: dict[str, Any],
) -> None:
    for name in [n for n, a in _gateway_args(services).items() if a.role == "actors"]:
        svc = services[name]
        test = svc["healthcheck"]["test"]
        assert test[:2] == ["CMD", "llmgw"]
        check = cli._parser().parse_args(test[2:])
        assert (check.command, check.area, check.verb) == ("admin", "log", "stats")
        assert check.bus is None and check.url is None  # the local socket: no key, no bus
        config = load_config(REPO / _sources_of(svc)[check.config])
        volumes = [c for c, src in _sources_of(svc).items() if not src.startswith(".")]
        assert str(Path(socket_path(config.database.path)).parent) in volumes


def test_compose_config_is_in_the_repository_and_valid_with_the_environment_compose_sets(
    services: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, a in _gateway_args(services).items():
        source = _sources_of(services[name])[a.config]
        for var, value in dict(services[name].get("environment") or {}).items():
            monkeypatch.setenv(var, str(value))
        path = REPO / source
        assert path.is_file(), (name, source)

        config = load_config(path)

        assert config.models, name


def test_dockerfile_installs_the_package_from_copied_sources_and_runs_unprivileged() -> None:
    steps = _dockerfile()
    copied = {
        args.split()[-1].rstrip("/"): args.split()[:-1] for kind, args in steps if kind == "COPY"
    }
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    installs = [args for kind, args in steps if kind == "RUN" and "pip install" in args]

    assert steps[0][0] == "FROM" and steps[0][1].startswith("python:3.1")
    for pkg in (p.rstrip("*") for p in packages):
        assert copied.get(f"/src/{pkg}") == [pkg], pkg
    assert "pyproject.toml" in copied["/src"]
    assert len(installs) == 1 and "pip install /src" in installs[0]
    assert " -e " not in installs[0] and "--editable" not in installs[0]
    user = [args for kind, args in steps if kind == "USER"]
    assert user and user[-1] not in ("root", "0")
    cmd = [json.loads(args) for kind, args in steps if kind == "CMD"][-1]
    assert cmd[0] == "llmgw" and cli._parser().parse_args(cmd[1:]).command == "serve"


def test_compose_actors_hosts_share_the_request_log_in_the_postgres_service(
    services: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (postgres,) = _postgres(services)
    actors = {n: a for n, a in _gateway_args(services).items() if a.role == "actors"}
    urls = set()
    for name, a in actors.items():
        for var, value in dict(services[name].get("environment") or {}).items():
            monkeypatch.setenv(var, str(value))
        url = load_config(REPO / _sources_of(services[name])[a.config]).database.url
        assert url is not None, name  # a second actors host on SQLite would be refused
        assert urlsplit(url).hostname == postgres, name
        assert services[name]["depends_on"][postgres] == {"condition": "service_healthy"}
        urls.add(url)
    assert len(actors) == 2 and len(urls) == 1
    assert services[postgres]["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
