"""Guard: with ``telemetry.enabled`` off (the default) the server loads no OpenTelemetry
module, so a gateway without the ``telemetry`` extra runs and pays nothing for it.

Runs the real server (actors and Hypercorn) in a fresh interpreter, serves one request through
the echo route, and lists the ``opentelemetry`` modules that interpreter loaded.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]

_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    import httpx
    from gateway.process.config import parse_config
    from gateway.process.serve import ServeOptions, run

    CONFIG = "database: {path: '%s'}\\nmodels: [{id: m, route: [{kind: echo}]}]\\n"

    async def main() -> None:
        shutdown = asyncio.Event()
        ready = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(run(
            parse_config(CONFIG, source="test"),
            ServeOptions("127.0.0.1", 0, "inproc://", "all", None),
            shutdown=shutdown,
            on_ready=lambda line: ready.done() or ready.set_result(line),
        ))
        url = (await asyncio.wait_for(ready, 30)).rsplit(" ", 1)[-1]
        async with httpx.AsyncClient(base_url=url) as client:
            answer = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert answer.status_code == 200, answer.text
        shutdown.set()
        await task
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))

    asyncio.run(main())
    """
)


def test_server_with_telemetry_off_imports_no_opentelemetry_module(tmp_path: Path) -> None:
    script = _SCRIPT % (tmp_path / "llmgw.sqlite3")
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
