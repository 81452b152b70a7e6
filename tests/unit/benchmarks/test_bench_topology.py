"""The benchmark's split topology: the config it writes, the commands it starts, when it
counts placement as settled and whose CPU a gateway row sums."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from gateway.process.actor_host import load_checked_config
from tests.benchmarks.bench import (
    StepResult,
    _gateway_cmd,
    _gateway_config,
    _parser,
    report,
    scaling_lines,
    server_cpu_us,
    with_baseline,
)
from tests.benchmarks.bench_topology import (
    ACTORS_NODE_ID,
    cluster_settled,
    role_args,
    topology_config,
    topology_label,
    topology_problem,
    until_served,
)
from tests.unit.benchmarks.rows import step_row

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

BUS = "nats://127.0.0.1:4222"


def _args(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(list(argv))


def _row(cpu: dict[str, float], topology: str = "split") -> StepResult:
    return step_row(cpu_pct=cpu, topology=topology)


def test_cluster_config_validates_as_the_actors_host_loads_it_with_defaults(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(_gateway_config("http://127.0.0.1:9") + topology_config(cluster=True))
    config = load_checked_config(str(path))
    assert config.cluster.enabled
    assert (config.cluster.heartbeat_seconds, config.cluster.ttl_seconds) == (1.0, 12.0)
    assert config.cluster.replicas_on(1) == 1  # as the one nats-server allows
    assert config.database.url is None  # one actors host keeps the request log in SQLite


def test_postgres_url_puts_the_request_log_in_postgresql(tmp_path: Path) -> None:
    url = "postgresql://postgres@127.0.0.1:5432/llmgw_bench"
    path = tmp_path / "gateway.yaml"
    path.write_text(_gateway_config("http://127.0.0.1:9") + topology_config(True, url))
    config = load_checked_config(str(path))
    assert config.cluster.enabled
    assert config.database.url == url


def test_topology_config_without_cluster_adds_nothing() -> None:
    assert topology_config(cluster=False) == ""


@pytest.mark.parametrize(
    ("roles", "cluster", "label"),
    [("one", False, "one"), ("split", False, "split"), ("split", True, "split+cluster")],
)
def test_topology_label_names_roles_and_cluster(roles: str, cluster: bool, label: str) -> None:
    assert topology_label(roles, cluster) == label


def test_topology_label_names_the_workers() -> None:
    assert topology_label("one", False, "2") == "workers=2"


@pytest.mark.parametrize(
    ("roles", "cluster", "bus", "workers", "refused"),
    [
        ("one", False, "inproc://", "1", None),
        ("split", False, "nats", "1", None),
        ("split", True, BUS, "1", None),
        ("one", True, "nats", "1", "--cluster needs --roles split"),
        ("split", False, "inproc://", "1", "--roles split needs a NATS bus"),
        ("split", False, "nats", "2", "--workers"),
    ],
)
def test_topology_problem_refuses_combinations_that_cannot_run(
    roles: str, cluster: bool, bus: str, workers: str, refused: str | None
) -> None:
    problem = topology_problem(roles=roles, cluster=cluster, bus=bus, workers=workers)
    if refused is None:
        assert problem is None
    else:
        assert problem is not None and refused in problem


def test_role_args_give_the_actors_host_no_port_and_the_ingress_its_role() -> None:
    assert role_args("actors", BUS) == [
        "--bus",
        BUS,
        "--role",
        "actors",
        "--node-id",
        ACTORS_NODE_ID,
    ]
    assert role_args("ingress", BUS) == ["--port", "0", "--bus", BUS, "--role", "ingress"]
    assert role_args("all", BUS) == ["--port", "0", "--bus", BUS]


def test_gateway_cmd_gives_http_knobs_to_the_ingress_only(tmp_path: Path) -> None:
    args = _args("--roles", "split", "--transport", "httpx", "--gateway-profile", "/tmp/p")
    config = tmp_path / "gateway.yaml"
    ingress = _gateway_cmd(args, config, BUS, "ingress")
    actors = _gateway_cmd(args, config, BUS, "actors")
    assert " --transport httpx " in " ".join(ingress)
    assert " --profile " in " ".join(ingress)
    serve = ["-m", "gateway.cli.main", "serve", "--config", str(config)]
    assert actors[1:] == [*serve, *role_args("actors", BUS)]


@pytest.mark.parametrize(
    ("answer", "settled"),
    [
        ({"members": [{"node_id": "a", "units": ["store", "models"]}], "unowned": []}, True),
        ({"members": [{"node_id": "a", "units": ["store"]}], "unowned": ["models"]}, False),
        ({"members": [{"node_id": "a", "units": []}], "unowned": []}, False),
        ({"members": [], "unowned": []}, False),
    ],
)
def test_cluster_settled_once_a_host_owns_units_and_none_is_unowned(
    answer: dict[str, Any], settled: bool
) -> None:
    assert cluster_settled(answer) is settled


def test_until_served_retries_until_a_request_is_served() -> None:
    calls: list[int] = []

    def check() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("HTTP Error 503")

    waits: list[float] = []
    until_served(check, timeout=30.0, sleep=waits.append)
    assert len(calls) == 3
    assert len(waits) == 2


def test_until_served_without_patience_raises_the_first_refusal() -> None:
    def check() -> None:
        raise RuntimeError("HTTP Error 503")

    with pytest.raises(RuntimeError, match="503"):
        until_served(check, timeout=0.0)


def test_gateway_cpu_per_request_sums_ingress_actors_host_and_nats() -> None:
    row = _row({"gateway": 30.0, "actors": 10.0, "nats": 10.0, "upstream": 5.0})
    assert server_cpu_us(row) == pytest.approx(5000.0)  # 50 % of a core over 100 req/s


def test_report_rows_name_their_topology() -> None:
    table = report([_row({"gateway": 50.0}, "split+cluster")], _args(), markdown=True)
    assert "| gateway | split+cluster | plain | 64 |" in table
    assert table.splitlines()[0].startswith("| target | topology | mode |")


def test_workers_rows_get_their_one_process_baseline_and_scaling_figure() -> None:
    direct = _row({"upstream": 40.0})
    direct.target, direct.topology = "direct", ""
    many = [direct, _row({"gateway": 90.0}, "workers=2")]  # 9,000 µs a request
    one = [_row({"gateway": 72.0}, "one")]  # 7,200 µs a request

    rows = with_baseline(many, one)
    table = report(rows, _args("--workers", "2"), markdown=False)

    assert [(r.topology, r.baseline) for r in rows] == [
        ("", False),
        ("one", True),
        ("workers=2", False),
    ]
    assert scaling_lines(rows) == [
        "workers=2 scaling, plain c=64: 0.80 (one process 7,200 µs ÷ workers=2 9,000 µs of "
        "gateway CPU per request; meets the ≥ 0.8 target)"
    ]
    assert scaling_lines(rows)[0] in table
    # The verdicts speak of the workers' row, not of its baseline.
    assert "9,000 µs of gateway CPU per request, i.e." in table
    assert "7,200 µs of gateway CPU per request, i.e." not in table


def test_no_scaling_figure_without_a_baseline() -> None:
    assert scaling_lines([_row({"gateway": 90.0}, "workers=2")]) == []
