"""Helpers of the limits e2e tests: a key with a limit, one request per surface through the
official SDKs, and the answer's status, error code and headers whatever the SDK raised."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anthropic
import openai

from tests.e2e.conftest import HI
from tests.e2e.keys_support import admin_http, cli

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import RunningGateway

SURFACES = ("chat", "responses", "embeddings", "messages")


@dataclass
class Outcome:
    """What one request got: HTTP status, the error code (None on success), headers, body."""

    status: int
    code: str | None
    headers: dict[str, str]
    body: Any


async def new_key(
    gw: RunningGateway, *, org: str = "acme", user: str = "alice", role: str = "pro"
) -> tuple[str, str]:
    """(key, key id) of a new gateway API key, made by the running gateway's keys owner through
    ``POST /admin/keys``: the owner ``llmgw keys create`` reaches too, without a Python start
    per key (the CLI's own tests, and :func:`cli_key`, start it)."""
    made = await admin_http(gw).post("/admin/keys", json={"org": org, "user": user, "role": role})
    assert made.status_code == 201, made.text
    return made.json()["key"], made.json()["id"]


async def cli_key(tmp_path: Path, *options: str, user: str = "alice") -> tuple[str, str]:
    """(key, key id) of a new key of ``user`` at acme made with ``llmgw keys create
    <options>`` (its limit flags, say)."""
    made = await cli(tmp_path, "create", "--org", "acme", "--user", user, "--role", "pro", *options)
    return made["key"], made["id"]


async def set_limit(gw: RunningGateway, kind: str, ident: str, **spec: Any) -> Any:
    """``PUT /admin/limits/{kind}/{id}`` with ``spec``; its JSON answer."""
    resp = await admin_http(gw).put(f"/admin/limits/{kind}/{ident}", json=spec)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _error_code(body: Any) -> str | None:
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return err.get("code") or err.get("type")
    return None


async def call(gw: RunningGateway, surface: str, key: str, model: str = "m", **kw: Any) -> Outcome:
    """One request on ``surface`` with the SDK of that surface."""
    try:
        if surface == "messages":
            raw = await gw.anthropic(key).messages.with_raw_response.create(
                model=model, max_tokens=kw.pop("max_tokens", 16), messages=HI, **kw
            )
        else:
            client = gw.openai(key)
            if surface == "chat":
                raw = await client.chat.completions.with_raw_response.create(
                    model=model, messages=HI, **kw
                )
            elif surface == "responses":
                raw = await client.responses.with_raw_response.create(model=model, input="hi", **kw)
            else:
                raw = await client.embeddings.with_raw_response.create(
                    model=model, input="hi", **kw
                )
        parsed = raw.parse()  # the anthropic SDK's is a coroutine, openai's is not
        if inspect.isawaitable(parsed):
            parsed = await parsed
        return Outcome(raw.status_code, None, dict(raw.headers), parsed)
    except (openai.APIStatusError, anthropic.APIStatusError) as exc:
        body = exc.response.json()
        code = _error_code(body)
        if surface == "messages":
            code = body.get("error", {}).get("type")
        return Outcome(exc.status_code, code, dict(exc.response.headers), body)
