"""A worker's metric values under ``--workers`` (gateway.ingress.metrics_sum): written to its
file once per loop iteration, and whole in what a scrape reads."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

# Run apart: prometheus-client picks its value class from the environment when imported.
_WORKER = textwrap.dedent(
    """
    import asyncio, json, sys
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector
    from gateway.ingress.metrics import GatewayMetrics

    def on_file():
        registry = CollectorRegistry()
        MultiProcessCollector(registry, sys.argv[1])
        return registry.get_sample_value("llmgw_requests_total", LABELS)

    LABELS = {"model": "m", "endpoint": "e", "surface": "chat"}

    async def main():
        metrics = GatewayMetrics()
        counter = metrics.requests.labels("m", "e", "chat")
        out = {}
        for _ in range(100):
            counter.inc()
        out["same_iteration"] = on_file()
        await asyncio.sleep(0)  # one loop iteration: the write it scheduled runs first
        out["next_iteration"] = on_file()
        counter.inc()
        scraped = generate_latest(metrics._exposed).decode()
        out["scraped"] = [
            line for line in scraped.splitlines() if line.startswith("llmgw_requests_total{")
        ]
        print(json.dumps(out))

    asyncio.run(main())
    """
)


def test_a_workers_values_reach_its_file_once_per_iteration_and_a_scrape_sees_them_all(
    tmp_path: Path,
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    shared = tmp_path / "metrics"
    shared.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(shared), "PATH": "/usr/bin:/bin"}
    env["PYTHONPATH"] = ":".join(sys.path)
    # Its stderr goes to this test's output, where pytest shows it on failure.
    printed = subprocess.check_output([sys.executable, script, shared], env=env, timeout=60)
    out = json.loads(printed.decode().strip().splitlines()[-1])
    assert out["same_iteration"] in (None, 0.0)  # not written yet: one write per iteration
    assert out["next_iteration"] == 100.0
    assert out["scraped"] == ['llmgw_requests_total{endpoint="e",model="m",surface="chat"} 101.0']


# Each scrape asks the health owner (here: a responder on the in-process bus) for every
# endpoint's state; the second answer no longer has "m:b" (a reload removed it).
_HEALTH_SCRAPES = textwrap.dedent(
    """
    import asyncio, json, warnings
    warnings.simplefilter("error")  # prometheus-client's multiprocess warnings fail the run
    from bus import InProcessBus
    from gateway.ingress.metrics import GatewayMetrics
    from schemas import EndpointState, HealthReport, subjects

    A = EndpointState(endpoint="m:a", model="m", circuit_state="open", availability=0.25)
    B = EndpointState(endpoint="m:b", model="m", circuit_state="closed", availability=1.0)
    REPORTS = [HealthReport(endpoints=(A, B)), HealthReport(endpoints=(A,))]

    async def owner(ready):
        async with bus.subscribe(subjects.HEALTH_DEEP) as sub:
            ready.set()
            async for env in sub:
                await env.respond(REPORTS.pop(0))

    async def main():
        ready = asyncio.Event()
        task = asyncio.create_task(owner(ready))
        await ready.wait()
        metrics = GatewayMetrics()
        scrapes = []
        for _ in REPORTS[:]:
            text = (await metrics.render(bus, timeout=5.0)).decode()
            scrapes.append([
                line for line in text.splitlines()
                if line.startswith(("llmgw_circuit_state{", "llmgw_endpoint_availability{"))
            ])
        task.cancel()
        print(json.dumps(scrapes))

    bus = InProcessBus()
    asyncio.run(main())
    """
)


def test_health_gauges_under_workers_follow_each_scrape_without_a_warning(tmp_path: Path) -> None:
    script = tmp_path / "scrapes.py"
    script.write_text(_HEALTH_SCRAPES)
    shared = tmp_path / "metrics"
    shared.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(shared), "PATH": "/usr/bin:/bin"}
    env["PYTHONPATH"] = ":".join(sys.path)
    printed = subprocess.check_output([sys.executable, script], env=env, timeout=60)
    first, second = json.loads(printed.decode().strip().splitlines()[-1])
    assert first == [
        'llmgw_circuit_state{endpoint="m:a",model="m"} 2.0',
        'llmgw_circuit_state{endpoint="m:b",model="m"} 0.0',
        'llmgw_endpoint_availability{endpoint="m:a",model="m"} 0.25',
        'llmgw_endpoint_availability{endpoint="m:b",model="m"} 1.0',
    ]
    assert second == [  # m:b is gone from the exposition, not left at its last values
        'llmgw_circuit_state{endpoint="m:a",model="m"} 2.0',
        'llmgw_endpoint_availability{endpoint="m:a",model="m"} 0.25',
    ]
