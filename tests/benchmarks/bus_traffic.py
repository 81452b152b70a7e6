"""What one request sends over the bus under ``llmgw serve --workers N``: messages and bytes.

    python -m tests.benchmarks.bus_traffic [--requests 300] [--workers 2]

Starts a nats-server with its monitoring port, the fast fake upstream and ``llmgw serve
--workers N --bus nats://...`` on it (bench.py's config), warms up, then sends ``--requests``
plain chat requests one after the other while a plain NATS client subscribed to ``>`` counts
every message by subject family. Prints messages and payload bytes per request by family, and
per client connection (from the server's ``/connz``) what it sent and what the server
delivered to it: the actors host (the connection with the most subscriptions), each worker,
and the counting client itself. A count, not a time: it holds on a busy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import nats

from tests.benchmarks.bench import (
    _GATEWAY_READY,
    Children,
    _gateway_config,
    _python,
    start_fast_upstream,
)
from tests.fixtures.nats import find_nats_server, free_port

if TYPE_CHECKING:
    from nats.aio.msg import Msg

__all__ = ["main"]

_NATS_READY = re.compile(r"Listening for client connections on \S+:(\d+)")
_SETTLE_S = 2.0  # events of the last request (a request-log batch waits up to 250 ms) land


def family(subject: str) -> str:
    """A subject with its id token starred (``llmgw.model.*.route``); replies as one."""
    parts = subject.split(".")
    if parts[0].startswith("_INBOX"):
        return "_INBOX.> (replies)"
    if len(parts) >= 4 or (len(parts) == 3 and parts[1] == "obs"):  # llmgw.obs.<endpoint>
        return ".".join([*parts[:2], "*", *parts[3:]])
    return subject


def _connz(monitor: str) -> dict[int, dict[str, Any]]:
    with urllib.request.urlopen(f"{monitor}/connz", timeout=10) as answer:
        conns = json.loads(answer.read())["connections"]
    return {int(c["cid"]): cast("dict[str, Any]", c) for c in conns}


def _chat(url: str) -> None:
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "hi"}]})
    req = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=body.encode(),
        headers={"content-type": "application/json", "authorization": "Bearer sk-bench"},
    )
    with urllib.request.urlopen(req, timeout=30) as answer:
        answer.read()


async def _count(url: str, monitor: str, nats_url: str, requests: int) -> None:
    for _ in range(20):  # warm-up: the first requests also fetch views and open pools
        await asyncio.to_thread(_chat, url)
    await asyncio.sleep(_SETTLE_S)
    nc = await nats.connect(nats_url, name="bus-traffic")
    msgs: collections.Counter[str] = collections.Counter()
    size: collections.Counter[str] = collections.Counter()

    async def on_msg(msg: Msg) -> None:
        msgs[family(msg.subject)] += 1
        size[family(msg.subject)] += len(msg.data)

    await nc.subscribe(">", cb=on_msg)
    await nc.flush()
    before = _connz(monitor)
    for _ in range(requests):
        await asyncio.to_thread(_chat, url)
    await asyncio.sleep(_SETTLE_S)
    after = _connz(monitor)
    await nc.close()
    total = sum(msgs.values())
    print(
        f"{requests} requests: {total / requests:.2f} messages, "
        f"{sum(size.values()) / requests:,.0f} payload bytes per request"
    )
    print("| subject | messages/req | bytes/message |\n|---|---:|---:|")
    for name, n in msgs.most_common():
        print(f"| {name} | {n / requests:.2f} | {size[name] / n:,.0f} |")
    print("| connection | subscriptions | sent/req | bytes | delivered/req | bytes |")
    print("|---|---:|---:|---:|---:|---:|")
    actors = max(after.values(), key=lambda c: int(c.get("subscriptions", 0)))["cid"]
    for cid, c in sorted(after.items()):
        a = before.get(cid)
        if a is None:
            continue
        who = c.get("name") or ("actors host" if cid == actors else "worker")
        print(
            f"| {who} | {c.get('subscriptions', 0)} "
            f"| {(c['in_msgs'] - a['in_msgs']) / requests:.2f} "
            f"| {(c['in_bytes'] - a['in_bytes']) / requests:,.0f} "
            f"| {(c['out_msgs'] - a['out_msgs']) / requests:.2f} "
            f"| {(c['out_bytes'] - a['out_bytes']) / requests:,.0f} |"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.bus_traffic")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--workers", default="2")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="llmgw-bus-traffic-") as scratch:
        tmp = Path(scratch)
        kids = Children(tmp)
        try:
            port = free_port()
            conf = tmp / "nats.conf"
            conf.write_text(f'http: "127.0.0.1:{port}"\njetstream {{ store_dir: "{tmp}/js" }}\n')
            cmd = [find_nats_server(), "-a", "127.0.0.1", "-p", "-1", "-c", str(conf)]
            _, m = kids.start("nats-server", cmd, _NATS_READY)
            nats_url = f"nats://127.0.0.1:{m.group(1)}"
            _, upstream = start_fast_upstream(kids, None)
            config = tmp / "gateway.yaml"
            config.write_text(_gateway_config(upstream) + "server: {engine: hypercorn}\n")
            serve = ["serve", "--config", str(config), "--bus", nats_url, "--port", "0"]
            serve += ["--workers", args.workers]
            gateway = _python("-m", "gateway.cli.main", *serve)
            _, m = kids.start("gateway", gateway, _GATEWAY_READY, cwd=tmp)  # its sqlite file
            asyncio.run(_count(m.group(1), f"http://127.0.0.1:{port}", nats_url, args.requests))
        finally:
            kids.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
