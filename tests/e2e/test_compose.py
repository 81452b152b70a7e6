"""compose.yaml: no container engine runs here, so its structure is checked and each gateway
command is parsed by the CLI's own argument parser (what the container would run)."""

from __future__ import annotations

import argparse
import re
import shlex
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway import cli
from tests.fixtures.gateway import REPO

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


def _gateway_args(services: dict[str, Any]) -> dict[str, argparse.Namespace]:
    return {name: cli._parser().parse_args(_llmgw_argv(svc["command"]))
            for name, svc in services.items() if name != "nats"}


def test_compose_has_nats_one_actors_and_two_ingress_services(services: dict[str, Any]) -> None:
    args = _gateway_args(services)
    roles = sorted(a.role for a in args.values())

    assert services["nats"]["image"].startswith("nats")
    assert "-js" in services["nats"]["command"]
    assert roles == ["actors", "ingress", "ingress"]
    assert all(a.command == "serve" for a in args.values())


def test_compose_gateway_commands_share_the_nats_service_bus_and_config(
    services: dict[str, Any],
) -> None:
    args = _gateway_args(services)

    for name, a in args.items():
        bus = urlsplit(a.bus)
        assert (bus.scheme, bus.hostname, bus.port) == ("nats", "nats", 4222), name
        assert a.config is not None, name
        mounts = [str(v).split(":")[1] for v in services[name].get("volumes", [])]
        assert a.config in mounts, (name, a.config, mounts)
        assert "nats" in services[name].get("depends_on", []) or any(
            "nats" in services[d].get("depends_on", []) for d in services[name]["depends_on"]
        ), name


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
        assert "actors" in services[name]["depends_on"], name

    assert len(set(published)) == len(published) == 2


def test_compose_actors_service_serves_no_http(services: dict[str, Any]) -> None:
    (actors,) = [n for n, a in _gateway_args(services).items() if a.role == "actors"]

    assert "ports" not in services[actors]


def test_compose_commands_are_the_scaled_out_commands_the_readme_documents(
    services: dict[str, Any],
) -> None:
    readme = (REPO / "README.md").read_text()
    documented = [cli._parser().parse_args(shlex.split(cmd)[1:])
                  for cmd in re.findall(r"`(llmgw serve [^`\n]*--role [^`\n]*)`", readme)]
    by_role = {a.role: a for a in documented}

    assert sorted(by_role) == ["actors", "ingress"]
    for name, a in _gateway_args(services).items():
        doc = by_role[a.role]
        assert (urlsplit(a.bus).scheme, urlsplit(a.bus).port) == (
            urlsplit(doc.bus).scheme, urlsplit(doc.bus).port), name
