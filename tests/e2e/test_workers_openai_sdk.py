"""``llmgw serve --workers 2``: one command, the actors in the supervisor process, two ingress
workers on one port, joined by the supervisor's private nats-server.

Both workers answer (each answer's ``x-request-id`` and ``/health`` name the process); state is
shared (a route's concurrency limit and a key's rate limit hold exactly across them, a circuit
opened through one refuses traffic through the other) and ``/metrics`` sums the requests of
both; ``llmgw admin reload`` reaches both through the supervisor's local socket; a worker
killed with SIGKILL is restarted while the other serves; SIGTERM stops everything (no worker
or nats-server left, the local admin socket removed). Serving, the kill and the stop are proven
on every HTTP engine (``server.engine``).
Each request that must be free to land on either worker goes on a fresh connection: the kernel
spreads connections over the workers' SO_REUSEPORT sockets by their source port.
The tests that neither kill nor stop the gateway share one module-wide gateway (``shared``), each
on its own model, fake upstreams and gateway key, so none sees another's traffic or limits.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import nats
import openai
import pytest
import pytest_asyncio
import yaml
from nats.js.api import StorageType
from prometheus_client.parser import text_string_to_metric_families

from bus import decode
from gateway.admin.local_socket import socket_path
from gateway.ingress import metrics_sum
from schemas import RouteDecided, subjects
from schemas.process_config import EventsConfig
from tests.e2e.conftest import (
    CHAT,
    HI,
    STAYS_OPEN,
    WAIT,
    assert_openai_error,
    chat,
    config,
    eid,
    model,
    route,
)
from tests.e2e.keys_support import db_path
from tests.e2e.limits_support import cli_key
from tests.e2e.workers_support import (
    SERVING,
    TRIES,
    Supervisor,
    alive,
    dead,
    health_pid,
    pid_of,
    refused,
    replace_a_worker,
    served,
    served_by,
    start_run,
    supervised,
)
from tests.fixtures.gateway import REPO
from tests.fixtures.nats import start_nats_server
from tests.fixtures.upstream import FakeUpstream, Held, Reply

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = [pytest.mark.e2e, pytest.mark.nats]


@pytest.fixture
async def supervisors() -> AsyncIterator[list[Supervisor]]:
    """Supervisors a test started; closed at teardown (stopped if the test left one running)."""
    async with supervised() as started:
        yield started


ADMIN = "sk-admin-workers-test"
LIMIT = 3
RPM = 5  # the key's requests a minute in the rate-limit test, out of LOAD sent at once
LOAD = 32
_ORPHANED = re.compile(r"the supervisor is gone: finishing the requests in flight")
IN_FLIGHT = 8  # requests held at the upstream when the supervisor is killed
# A worker whose supervisor died exits this soon after its last answer: less than the request
# log's wait for a store at stop (CLOSE_WAIT_S, 5 s), which it must not spend on a dead one.
ORPHAN_EXIT_S = 3.0


@dataclass
class Shared:
    """The module's one running gateway and the fake upstreams behind its models: ``slots``
    and ``spare`` behind model ``conc``, ``failing`` behind ``circ``, ``plain`` behind ``a``,
    ``counted`` behind ``rl``. Keys are on (auth ``auto``, keys exist): ``auth`` presents a
    key no test exhausts, ``limited`` holds the rate-limit test's ``RPM``."""

    sup: Supervisor
    slots: FakeUpstream
    spare: FakeUpstream
    failing: FakeUpstream
    plain: FakeUpstream
    counted: FakeUpstream
    auth: dict[str, str]
    limited: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Shared]:
    """One ``llmgw serve --workers 2`` for the tests that do not own the process: starting one
    takes seconds, and each of these tests has its own model and upstreams on it."""
    tmp_path = tmp_path_factory.mktemp("shared")
    async with (
        FakeUpstream("slots") as slots,
        FakeUpstream("spare") as spare,
        FakeUpstream("failing") as failing,
        FakeUpstream("plain") as plain,
        FakeUpstream("counted") as counted,
    ):
        # Made in the database before the start, one writer at a time.
        key, _ = await cli_key(tmp_path, "--rpm", "100000", "--tpm", "1000000000", user="bob")
        limited, _ = await cli_key(tmp_path, "--rpm", str(RPM), "--tpm", "1000000")
        cfg = config(
            model(
                "conc",
                route(slots, provider_type="concurrency", concurrency={"limit": LIMIT}),
                route(spare, fallback_only=True),
            ),
            model("circ", route(failing)),
            model("a", route(plain)),
            model("rl", route(counted)),
            circuit=STAYS_OPEN,
            admin_key=ADMIN,
            database={"path": db_path(tmp_path)},
        )
        started: list[Supervisor] = []
        try:
            sup = await start_run(started, tmp_path, cfg)
            auth = {"authorization": f"Bearer {key}"}
            yield Shared(sup, slots, spare, failing, plain, counted, auth, limited)
        finally:
            for sup in started:
                await sup.close()


async def test_two_workers_both_answer_survive_a_kill_and_stop_clean(
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    supervisors: list[Supervisor],
    engine: str,
) -> None:
    cfg = config(model("m", route(fake_upstream)), server={"engine": engine})
    sup = await start_run(supervisors, tmp_path, cfg)
    nats = int(sup.seen(re.compile(r"embedded nats-server \(pid (\d+)\)")).group(1))
    workers = sup.worker_pids()
    seen = {await health_pid(sup.url) for _ in range(TRIES)}

    victim, survivor = sorted(workers)
    os.kill(victim, signal.SIGKILL)
    await dead(victim)
    # Until the replacement serves, every fresh connection is answered by the survivor.
    client = openai.AsyncOpenAI(
        base_url=f"{sup.url}/v1",
        api_key="sk-test",
        max_retries=0,
        default_headers={"connection": "close"},
    )
    async with client:
        meanwhile = [
            await client.chat.completions.with_raw_response.create(model="m", messages=HI)
            for _ in range(4)
        ]
        restarted = await sup.line(SERVING)
        replacement = int(restarted.group(2))
        after = {await health_pid(sup.url) for _ in range(TRIES)}
    code = await sup.stop()

    assert len(workers) == 2 and seen == workers
    assert all(r.status_code == 200 for r in meanwhile)
    assert {pid_of(r.headers) for r in meanwhile} <= {survivor, replacement}
    assert replacement not in workers and after == {survivor, replacement}
    assert code == 0
    assert not any(alive(pid) for pid in (survivor, replacement, nats))
    assert not socket_path(tmp_path / "gw.sqlite3").exists()
    assert not any("nats://llmgw:" in line and "***" not in line for line in sup.lines)


async def test_the_embedded_nats_server_killed_stops_the_gateway_with_exit_1_and_one_reason(
    tmp_path: Path, fake_upstream: FakeUpstream, supervisors: list[Supervisor]
) -> None:
    # Nothing brings a run's private server back: the workers would answer 503s forever while
    # every process retried it each second. The supervisor says why and stops everything.
    cfg = config(model("m", route(fake_upstream)))
    sup = await start_run(supervisors, tmp_path, cfg)
    nats = int(sup.seen(re.compile(r"embedded nats-server \(pid (\d+)\)")).group(1))
    workers = sup.worker_pids()
    assert await served(sup, workers, "m") == workers  # both done starting

    os.kill(nats, signal.SIGKILL)
    assert sup.proc is not None
    code = await asyncio.to_thread(sup.proc.wait, WAIT * 3)
    await sup.rest()

    assert code == 1
    reason = re.compile(rf"ERROR llmgw: stopping: the embedded nats-server \(pid {nats}\) exited")
    assert sup.seen(reason)
    assert not [pid for pid in workers if alive(pid)]
    assert not socket_path(tmp_path / "gw.sqlite3").exists()
    run = re.compile(rf"llmgw-\w+-{sup.proc.pid}-")  # its nats and metrics temp dirs
    assert not [name for name in os.listdir(tempfile.gettempdir()) if run.match(name)]
    assert not any(line.startswith("Traceback") for line in sup.lines), "\n".join(sup.lines)


async def test_ctrl_c_drains_the_workers_on_a_live_bus_and_their_request_log_is_kept(
    tmp_path: Path, fake_upstream: FakeUpstream, supervisors: list[Supervisor]
) -> None:
    # A terminal's Ctrl-C sends SIGINT to its whole foreground process group: the supervisor,
    # the workers and (unless it has a group of its own) the nats-server, which then died at
    # once, and the draining workers lost the bus and their requests' log rows with it.
    sup = await start_run(
        supervisors, tmp_path, config(model("m", route(fake_upstream))), session=True
    )
    assert sup.proc is not None
    fake_upstream.set_default(Held())
    clients = [httpx.AsyncClient(base_url=sup.url, timeout=WAIT) for _ in range(IN_FLIGHT)]
    try:
        load = [asyncio.create_task(c.post(CHAT, json=chat("m"))) for c in clients]
        await fake_upstream.wait_for_requests(IN_FLIGHT, timeout=WAIT)
        os.killpg(sup.proc.pid, signal.SIGINT)
        await refused(sup.url)  # both workers draining: none takes a connection
        fake_upstream.release_held()
        answers = await asyncio.gather(*load)
    finally:
        for c in clients:
            await c.aclose()
    code = await asyncio.to_thread(sup.proc.wait, WAIT * 3)
    await sup.rest()

    assert [a.status_code for a in answers] == [200] * IN_FLIGHT
    assert code == 0
    assert not [line for line in sup.lines if "not acknowledged" in line], "\n".join(sup.lines)
    assert not [line for line in sup.lines if "NATS: disconnected" in line]


async def test_sighup_to_every_process_reloads_and_leaves_the_workers_serving(
    tmp_path: Path, fake_upstream: FakeUpstream, supervisors: list[Supervisor]
) -> None:
    # `pkill -HUP -f llmgw`, or a SIGHUP to the terminal's process group, reaches the workers
    # too: one must not end them (and the requests they hold) but do what SIGHUP does.
    sup = await start_run(
        supervisors, tmp_path, config(model("m", route(fake_upstream))), session=True
    )
    assert sup.proc is not None
    workers = sup.worker_pids()
    fake_upstream.set_default(Held())
    clients = [httpx.AsyncClient(base_url=sup.url, timeout=WAIT) for _ in range(IN_FLIGHT)]
    try:
        load = [asyncio.create_task(c.post(CHAT, json=chat("m"))) for c in clients]
        await fake_upstream.wait_for_requests(IN_FLIGHT, timeout=WAIT)
        os.killpg(sup.proc.pid, signal.SIGHUP)
        await sup.line(re.compile(r"SIGHUP: config reloaded"))
        fake_upstream.release_held()
        answers = await asyncio.gather(*load, return_exceptions=True)
    finally:
        for c in clients:
            await c.aclose()
    code = await sup.stop()
    await sup.rest()

    assert [getattr(a, "status_code", a) for a in answers] == [200] * IN_FLIGHT
    assert not [line for line in sup.lines if "exited with code" in line]
    assert sup.worker_pids() == workers
    assert code == 0


async def test_a_restarted_worker_serves_the_config_the_actors_run_not_the_file_as_edited(
    tmp_path: Path, fake_upstream: FakeUpstream, supervisors: list[Supervisor]
) -> None:
    # An operator's edit in progress (here one that does not validate), not reloaded: the
    # worker replacing a crashed one read the file and could not start; after five tries the
    # whole gateway stopped. It is given the text the actors run, and a reload's after one.
    sup = await start_run(supervisors, tmp_path, config(model("m", route(fake_upstream))))
    running = yaml.safe_load(sup.cfg.read_text())
    broken = {**running, "models": [{"id": "m", "route": [{"kind": "nope"}]}]}
    sup.cfg.write_text(yaml.safe_dump(broken))

    live = await replace_a_worker(sup, sup.worker_pids())
    served_m, before = await served(sup, live, "m"), live
    grown = {**running, "models": [*running["models"], {"id": "b", "route": [{"kind": "echo"}]}]}
    sup.cfg.write_text(yaml.safe_dump(grown))
    reload = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gateway.cli.main", "admin", "reload", "--config", str(sup.cfg)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=WAIT * 3,
        check=False,
    )
    served_b_before = await served(sup, before, "b")
    live = await replace_a_worker(sup, live)
    served_b = await served(sup, live, "b")

    assert served_m == before
    assert reload.returncode == 0, reload.stderr
    assert served_b_before == before and served_b == live
    assert not [line for line in sup.lines if "invalid configuration" in line]


async def test_a_worker_restarted_while_the_bus_is_down_waits_for_it_and_the_gateway_stays(
    tmp_path: Path, fake_upstream: FakeUpstream, supervisors: list[Supervisor]
) -> None:
    # With --bus nats://, a NATS server down (restarting, say) when a worker crashed made
    # each replacement exit on the unreachable bus; five in a row and the whole gateway
    # stopped, while the running processes were waiting for the server, as documented.
    with ExitStack() as stack:
        url = stack.enter_context(start_nats_server())
        cfg = config(model("m", route(fake_upstream)), bus={"url": url})
        sup = await start_run(supervisors, tmp_path, cfg)
        live = sup.worker_pids()
        stack.close()  # the server goes down
        victim = min(live)
        os.kill(victim, signal.SIGKILL)
        await dead(victim)
        await sup.line(re.compile(r"waiting for the bus to come back"))
        stack.enter_context(start_nats_server(port=int(url.rsplit(":", 1)[1])))
        await sup.line(SERVING)  # the victim's replacement, once the bus is back
        served = await served_by(sup, 2, "m")
        code = await sup.stop()
        await sup.rest()

    # Which processes serve is asked of the gateway, not assumed: in one CI run the other
    # worker was replaced during the outage too (why is not known; its lines are below).
    said = "\n".join(sup.lines)
    assert len(served) == 2 and victim not in served, said
    assert served <= sup.worker_pids(), said  # each one a worker the supervisor started
    assert code == 0, said
    assert not [line for line in sup.lines if "exited with code 2" in line], said


async def test_a_supervisor_killed_leaves_workers_that_answer_in_flight_requests_and_exit_clean(
    tmp_path: Path, fake_upstream: FakeUpstream, supervisors: list[Supervisor]
) -> None:
    # kill -9 of the supervisor takes its actors and (PR_SET_PDEATHSIG) its nats-server along;
    # each worker sees its stdin end, finishes what it holds, says which request-log rows it
    # lost (no store is left to take them) and exits: no reconnecting to the dead server, no
    # waiting for the store, no traceback.
    sup = await start_run(supervisors, tmp_path, config(model("m", route(fake_upstream))))
    assert sup.proc is not None
    nats = int(sup.seen(re.compile(r"embedded nats-server \(pid (\d+)\)")).group(1))
    scratch = _scratch_dirs(nats, *sup.worker_pids())
    fake_upstream.set_default(Held())
    clients = [httpx.AsyncClient(base_url=sup.url, timeout=WAIT) for _ in range(IN_FLIGHT)]
    try:
        load = [asyncio.create_task(c.post(CHAT, json=chat("m"))) for c in clients]
        await fake_upstream.wait_for_requests(IN_FLIGHT, timeout=WAIT)
        sup.proc.kill()
        for _ in sup.worker_pids():
            await sup.line(_ORPHANED)
        fake_upstream.release_held()
        answers = await asyncio.gather(*load)
        async with asyncio.timeout(ORPHAN_EXIT_S):
            for pid in sup.worker_pids():
                await dead(pid)
        await sup.rest()  # every worker's stderr, to its end
        left = [each for each in scratch if each.exists()]  # the supervisor could not
        await start_run(supervisors, tmp_path, config(model("m", route(fake_upstream))))
        swept = [each for each in scratch if not each.exists()]
    finally:
        for c in clients:
            await c.aclose()
        for each in scratch:
            shutil.rmtree(each, ignore_errors=True)
    lost = [
        re.search(r"(\d+) rows not acknowledged .* \((\d+) never sent: lost\)", line)
        for line in sup.lines
    ]

    assert [a.status_code for a in answers] == [200] * IN_FLIGHT
    assert not any(alive(pid) for pid in (*sup.worker_pids(), nats))
    # Its scratch (this run's bus password among them) is removed by the next run.
    assert left == scratch and swept == scratch
    assert not any("Traceback" in line for line in sup.lines), "\n".join(sup.lines)
    # Each answered request left its row and its attempt's, and no store could take them.
    assert sum(int(m.group(2)) for m in lost if m) == 2 * IN_FLIGHT


def _scratch_dirs(nats: int, *workers: int) -> list[Path]:
    """The run's temporary directories: the nats-server's (its config file's) and the
    workers' metrics directory."""
    args = Path(f"/proc/{nats}/cmdline").read_bytes().decode().split("\0")
    dirs = [Path(args[args.index("-c") + 1]).parent]
    for pid in workers:
        env = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
        dirs += [Path(v.split("=", 1)[1]) for v in env if v.startswith(f"{metrics_sum.ENV}=")]
    return dirs


@pytest.mark.asyncio(loop_scope="module")
async def test_a_concurrency_limit_holds_exactly_across_two_workers_and_metrics_sum_them(
    shared: Shared,
) -> None:
    sup, slots, spare = shared.sup, shared.slots, shared.spare
    slots.set_default(Held())
    # Each connection's worker is the kernel's hash of its ports (SO_REUSEPORT): with 9 of
    # them all landed on one worker about once in 256 runs (it happened in CI); with 24, once
    # in 8 million.
    total = 8 * LIMIT
    clients = [
        httpx.AsyncClient(base_url=sup.url, timeout=WAIT * 3, headers=shared.auth)
        for _ in range(total)
    ]
    try:
        load = [asyncio.create_task(c.post(CHAT, json=chat("conc"))) for c in clients]
        await slots.wait_for_requests(LIMIT, timeout=WAIT)
        await spare.wait_for_requests(total - LIMIT, timeout=WAIT)
        held_at_once = slots.max_in_flight
        slots.release_held()
        answers = await asyncio.gather(*load)
        # A next request on each connection: its worker has finished (and counted) the first.
        await asyncio.gather(*(c.get("/health") for c in clients))
        admin = {"authorization": f"Bearer {ADMIN}"}  # keys are on: /metrics is for operators
        async with httpx.AsyncClient(base_url=sup.url, timeout=WAIT, headers=admin) as fresh:
            scraped = (await fresh.get("/metrics")).text
    finally:
        for c in clients:
            await c.aclose()
    counted = {
        sample.labels["endpoint"]: sample.value
        for family in text_string_to_metric_families(scraped)
        for sample in family.samples
        if sample.name == "llmgw_requests_total" and sample.labels["model"] == "conc"
    }

    assert [a.status_code for a in answers] == [200] * total
    assert len({pid_of(a.headers) for a in answers}) == 2  # both workers took part
    assert held_at_once == LIMIT and slots.max_in_flight == LIMIT
    assert len(slots.requests) == LIMIT
    # /metrics, whichever worker answers it, counts every worker's requests.
    assert counted == {eid("conc", slots): LIMIT, eid("conc", spare): total - LIMIT}


@pytest.mark.asyncio(loop_scope="module")
async def test_a_second_workers_run_on_a_served_port_is_refused_in_one_line(
    shared: Shared, tmp_path: Path
) -> None:
    # SO_REUSEPORT would let a second run of this user join the port; the kernel would then
    # spread connections over two gateways (two configs, two states), with nothing said.
    port = int(shared.sup.url.rsplit(":", 1)[1])
    path = tmp_path / "other.yaml"
    other = config(model("a", route(shared.plain)), database={"path": str(tmp_path / "o.db")})
    path.write_text(yaml.safe_dump(other))
    argv = ["serve", "--workers", "2", "--port", str(port), "--config", str(path)]

    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gateway.cli.main", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=WAIT * 3,
        check=False,
    )

    assert done.returncode == 2, done.stderr
    assert done.stdout == ""  # no ready line
    assert "Traceback" not in done.stderr
    last = done.stderr.splitlines()[-1]
    assert last == f"llmgw: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert await health_pid(shared.sup.url) in shared.sup.worker_pids()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_key_rate_limit_holds_exactly_across_two_workers(shared: Shared) -> None:
    # The key's counter lives in the supervisor's actors: whichever worker admits, the
    # minute's allowance is spent once.
    sup, counted = shared.sup, shared.counted

    async def ask() -> httpx.Response:
        auth = {"authorization": f"Bearer {shared.limited}"}
        async with httpx.AsyncClient(base_url=sup.url, timeout=WAIT, headers=auth) as fresh:
            return await fresh.post(CHAT, json=chat("rl"))  # a fresh connection: either worker

    answers = await asyncio.gather(*(ask() for _ in range(LOAD)))

    assert Counter(r.status_code for r in answers) == {200: RPM, 429: LOAD - RPM}
    assert len(counted.requests) == RPM
    refused = [r for r in answers if r.status_code == 429]
    assert_openai_error(refused[0], 429, "rate_limited")
    # Both workers answered (the chance that 32 fresh connections all land on one is 2**-31).
    assert {pid_of(r.headers) for r in answers} == sup.worker_pids()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_circuit_opened_through_one_worker_is_refused_by_the_other(
    shared: Shared,
) -> None:
    sup, failing = shared.sup, shared.failing
    failing.set_default(Reply(500))
    admin = {"authorization": f"Bearer {ADMIN}"}
    async with (
        httpx.AsyncClient(base_url=sup.url, timeout=WAIT) as events_client,
        events_client.stream("GET", "/events?kind=circuit", headers=admin) as events,
        httpx.AsyncClient(base_url=sup.url, timeout=WAIT, headers=shared.auth) as one,  # one worker
    ):
        lines = events.aiter_lines()
        assert (await anext(lines)).startswith(":")  # subscribed
        failed = [await one.post(CHAT, json=chat("circ")) for _ in range(2)]
        async with asyncio.timeout(WAIT):
            async for line in lines:
                if line.startswith("data:") and '"open"' in line:
                    break
        opened_by = {pid_of(r.headers) for r in failed}
        refused: httpx.Response | None = None
        for _ in range(TRIES):
            async with httpx.AsyncClient(base_url=sup.url, timeout=WAIT, headers=shared.auth) as f:
                resp = await f.post(CHAT, json=chat("circ"))
            if pid_of(resp.headers) not in opened_by:
                refused = resp
                break

    assert [r.status_code for r in failed] == [502, 502] and len(opened_by) == 1
    assert refused is not None
    assert_openai_error(refused, 503, "all_circuits_open")
    assert len(failing.requests) == 2


@pytest.mark.asyncio(loop_scope="module")
async def test_llmgw_admin_reload_through_the_local_socket_reaches_every_worker(
    shared: Shared, tmp_path: Path
) -> None:
    # The reload only adds model "b": the other tests' models on the shared gateway stay.
    sup = shared.sup
    path = sup.cfg
    grown = {**yaml.safe_load(path.read_text())}
    grown["models"] = [*grown["models"], {"id": "b", "route": [{"kind": "echo"}]}]
    path.write_text(yaml.safe_dump(grown))

    reload = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gateway.cli.main", "admin", "reload", "--config", str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=WAIT * 3,
        check=False,
    )
    # The workers follow the actors' ConfigChanged on their own; no event reaches this test
    # from each of them, so: bounded polling, on fresh connections, until both serve "b".
    served: set[int] = set()
    for _ in range(int(WAIT / 0.01)):
        async with httpx.AsyncClient(base_url=sup.url, timeout=WAIT, headers=shared.auth) as fresh:
            resp = await fresh.post(CHAT, json=chat("b"))
        if resp.status_code == 200:
            served.add(pid_of(resp.headers))
        if served == sup.worker_pids():
            break
        await asyncio.sleep(0.01)

    assert reload.returncode == 0, reload.stderr
    assert served == sup.worker_pids()


def _private_nats_url(sup: Supervisor) -> str:
    """The URL of ``sup``'s embedded nats-server, with the password from its config file (this
    user's own, mode 0600; named on the server's command line)."""
    found = sup.seen(re.compile(r"embedded nats-server \(pid (\d+)\) on (\S+):(\d+)"))
    args = Path(f"/proc/{found.group(1)}/cmdline").read_bytes().decode().split("\0")
    conf = Path(args[args.index("-c") + 1]).read_text()
    password = re.search(r'password: "([^"]+)"', conf)
    assert password is not None
    return f"nats://llmgw:{password.group(1)}@{found.group(2)}:{found.group(3)}"


@pytest.mark.asyncio(loop_scope="module")
async def test_the_events_stream_on_the_private_nats_server_is_in_memory_and_keeps_decisions(
    shared: Shared,
) -> None:
    # The private server's files die with the run, so a file store bought nothing and cost it
    # tens of µs per event (every request's decision): the stream is in its memory, and an
    # observability consumer replaying it still finds each request's decision.
    sup = shared.sup
    nc = await nats.connect(_private_nats_url(sup))
    try:
        js = nc.jetstream()
        info = await js.stream_info(subjects.EVENTS_STREAM)
        async with httpx.AsyncClient(base_url=sup.url, timeout=WAIT, headers=shared.auth) as c:
            resp = await c.post(CHAT, json=chat("a"))
        assert resp.status_code == 200
        rid = resp.headers["x-request-id"]
        kept = await js.subscribe(
            subjects.event("decision"), stream=subjects.EVENTS_STREAM, ordered_consumer=True
        )
        async with asyncio.timeout(WAIT):
            while True:
                decided = decode((await kept.next_msg(timeout=WAIT)).data)
                if isinstance(decided, RouteDecided) and decided.request_id == rid:
                    break
    finally:
        await nc.close()

    assert info.config.storage == StorageType.MEMORY
    # Each kind bounded apart: the per-request decisions cannot push the rarer events out.
    assert info.config.max_msgs_per_subject == EventsConfig().stream_max_msgs_per_kind
    assert decided.model == "a"
