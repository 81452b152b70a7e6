"""The LiteLLM proxy as a benchmark target beside the gateway (``bench.py --litellm BIN``).

The baseline the issue's figures compare against: the most-used Python gateway, in the
gateway's place (its cores), one worker, forwarding the bench model to the same fast upstream.
It is not a dependency: install it in a venv of its own (its pins clash with ours), e.g.
``python -m venv /tmp/llvenv && /tmp/llvenv/bin/pip install 'litellm[proxy]==1.108.7'``, and
pass that venv's ``litellm`` script.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from tests.fixtures.nats import free_port

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable
    from pathlib import Path

READY = re.compile(r"Uvicorn running on (http://[0-9.]+:\d+)")
STARTUP_S = 120.0  # it imports for several seconds, longer on a slow machine


def config(upstream_url: str, model: str, upstream_model: str, key: str = "sk-bench") -> str:
    """LiteLLM's config: ``model`` forwarded to the upstream's ``upstream_model`` (an OpenAI
    API), ``key`` its master key (this version refuses to start without one; the load
    generator's key)."""
    return (
        "model_list:\n"
        f"  - model_name: {model}\n"
        "    litellm_params:\n"
        f"      model: openai/{upstream_model}\n"
        f"      api_base: {upstream_url}/v1\n"
        "      api_key: sk-bench\n"
        f"general_settings:\n  master_key: {key}\n"
    )


def start(
    launch: Callable[..., tuple[subprocess.Popen[bytes], re.Match[str]]],
    binary: str,
    config_text: str,
    scratch: Path,
    pinned: Callable[[list[str]], list[str]],
) -> tuple[str, int]:
    """Start LiteLLM's proxy (``binary``) with ``config_text`` on a free loopback port through
    ``launch`` (``Children.start``), its command wrapped by ``pinned``; returns its URL and
    pid. Raises RuntimeError when it does not come up."""
    path = scratch / "litellm.yaml"
    path.write_text(config_text)
    cmd = [binary, "--config", str(path), "--host", "127.0.0.1", "--port", str(free_port())]
    proc, match = launch("litellm", pinned([*cmd, "--num_workers", "1"]), READY, timeout=STARTUP_S)
    return match.group(1), proc.pid
