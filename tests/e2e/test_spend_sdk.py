"""Spend through the real gateway on both buses: each attempt and request is priced from the
route's ``pricing:`` and the upstream's usage (or the gateway's estimate, marked), the
request log stores it, ``spend report`` sums it by key, user, org and model, and
``/metrics`` exports it."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

import anthropic
import pytest
import yaml

from schemas import Observation, subjects
from schemas.limits import LimitSettle
from tests.e2e.conftest import HI, PROCESS_WAIT, anthropic_route, eid, model, route, watch
from tests.e2e.keys_support import admin_http, keys_config
from tests.e2e.limits_support import call, new_key, set_limit
from tests.fixtures.gateway import REPO, GatewayFactory, RunningGateway
from tests.fixtures.upstream import FakeUpstream, Reply, Stream

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.e2e

PRICING = {"prompt": 2.0, "completion": 10.0, "input_cache_reads": 0.5}
# The fake upstream reports 10 prompt tokens (4 of them cached) and 5 completion tokens.
COST = (6 * 2.0 + 4 * 0.5 + 5 * 10.0) / 1e6
_SSE = {"content-type": "text/event-stream"}


async def admin_cli(conf: Path, *args: str) -> tuple[int, str, str]:
    """``llmgw admin ARGS --config CONF`` in a child process: its exit code, out and err."""
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "gateway.cli.main", "admin", *args, "--config", str(conf)),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    # A whole interpreter starts (about 1 s of imports alone): not an event's WAIT.
    try:
        out, err = await asyncio.wait_for(proc.communicate(), PROCESS_WAIT)
    finally:
        if proc.returncode is None:  # never left holding the socket past the test
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _admin(gw: RunningGateway, area: str, verb: str, **args: Any) -> Any:
    resp = await admin_http(gw).post(f"/admin/{area}/{verb}", json=args)
    assert resp.status_code == 200, resp.text
    return resp.json()


async def test_costs_in_the_log_match_pricing_and_usage_and_the_report_sums_them(
    gateway_factory: GatewayFactory,
    fake_upstreams: Any,
    tmp_path: Path,
) -> None:
    up: FakeUpstream = await fake_upstreams(
        "up1", prompt_tokens=10, completion_tokens=5, cached_tokens=4
    )
    gw = await gateway_factory(keys_config(tmp_path, model("m", route(up, pricing=PRICING))))
    alice, alice_id = await new_key(gw, org="acme", user="alice")
    bob, bob_id = await new_key(gw, org="beta", user="bob")
    for surface in ("chat", "responses", "messages"):
        assert (await call(gw, "chat" if surface == "chat" else surface, alice)).status == 200
    assert (await call(gw, "chat", bob)).status == 200

    rows = (await _admin(gw, "log", "query", kind="request"))["rows"]
    assert len(rows) == 4
    assert all(r["cost_usd"] == pytest.approx(COST) and not r["cost_estimated"] for r in rows)
    assert {r["key_id"] for r in rows} == {alice_id, bob_id}
    attempts = (await _admin(gw, "log", "query", kind="attempt"))["rows"]
    assert all(r["cost_usd"] == pytest.approx(COST) for r in attempts)

    by_key = await _admin(gw, "spend", "report", group_by="key")
    got = {g["key"]: (g["requests"], g["cost_usd"]) for g in by_key["groups"]}
    assert got[alice_id] == (3, pytest.approx(3 * COST))
    assert got[bob_id] == (1, pytest.approx(COST))
    assert by_key["total_usd"] == pytest.approx(4 * COST)
    by_user = await _admin(gw, "spend", "report", group_by="user")
    assert {g["user"] for g in by_user["groups"]} == {"acme/alice", "beta/bob"}
    by_org = await _admin(gw, "spend", "report", group_by="org", since=0)
    assert {g["org"]: g["requests"] for g in by_org["groups"]} == {"acme": 3, "beta": 1}
    empty = await _admin(gw, "spend", "report", group_by="model", since=0, until=1)
    assert empty["groups"] == [] and empty["total_usd"] == 0

    bad = await admin_http(gw).post("/admin/spend/report", json={"group_by": "planet"})
    assert bad.status_code == 400 and "group_by" in bad.text

    metrics = (await admin_http(gw).get("/metrics")).text
    line = next(
        ln
        for ln in metrics.splitlines()
        if ln.startswith("llmgw_spend_usd_total{") and f'key="{alice_id}"' in ln
    )
    assert 'org="acme"' in line and float(line.rsplit(" ", 1)[1]) == pytest.approx(3 * COST)


async def test_an_answer_without_usage_is_priced_from_the_estimate_and_marked(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    gw = await gateway_factory(
        keys_config(tmp_path, model("m", route(fake_upstream, pricing=PRICING)))
    )
    key, _ = await new_key(gw)
    fake_upstream.enqueue(
        Reply(
            body={
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "12345678"},
                    }
                ],
            }
        )
    )
    assert (await call(gw, "chat", key)).status == 200
    rows = (await _admin(gw, "log", "query"))["rows"]
    assert {r["kind"] for r in rows} == {"request", "attempt"}
    for row in rows:  # the request and its one attempt
        assert row["cost_estimated"] is True
        # The tokens the cost was computed from (they showed 0 and 0 beside that cost):
        # 8 characters answered, 2 completion tokens; the prompt's size estimate.
        assert row["completion_tokens"] == 2
        assert row["prompt_tokens"] > 0
        priced = row["prompt_tokens"] * 2.0 + row["completion_tokens"] * 10.0
        assert row["cost_usd"] == pytest.approx(priced / 1e6)
    # /metrics counts tokens upstreams reported: this request's were guessed.
    text = (await admin_http(gw).get("/metrics")).text
    counted = [ln for ln in text.splitlines() if ln.startswith("llmgw_tokens_total{")]
    assert counted and all(ln.endswith(" 0.0") for ln in counted), counted


async def test_a_stream_is_billed_on_reported_usage_though_its_client_did_not_ask_for_it(
    gateway_factory: GatewayFactory,
    fake_upstreams: Any,
    tmp_path: Path,
) -> None:
    # It was billed on the estimate (body bytes / 4, content characters / 4, no cache
    # price): the gateway never asked the upstream for the usage it would have reported.
    up: FakeUpstream = await fake_upstreams(
        "up1", prompt_tokens=10, completion_tokens=5, cached_tokens=4
    )
    gw = await gateway_factory(keys_config(tmp_path, model("m", route(up, pricing=PRICING))))
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, tpm=100_000)
    chunks = [
        c
        async for c in await gw.openai(key).chat.completions.create(
            model="m", messages=HI, stream=True
        )
    ]
    assert up.requests[-1].json["stream_options"] == {"include_usage": True}
    # The client, which did not ask, gets no usage chunk (nor a usage field).
    assert all(c.choices and c.usage is None for c in chunks)
    (row,) = (await _admin(gw, "log", "query", kind="request"))["rows"]
    assert (row["prompt_tokens"], row["completion_tokens"], row["cost_estimated"]) == (
        10,
        5,
        False,
    )
    assert row["cost_usd"] == pytest.approx(COST)
    got = await admin_http(gw).get(f"/admin/limits/key/{key_id}")
    assert got.json()["usage"]["tokens_last_minute"] == 15


async def test_a_streamed_tool_call_without_usage_is_estimated_on_its_arguments(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    # The stream's estimate counted content only: a tool call's arguments were 0 tokens
    # (an answer given whole counted them).
    gw = await gateway_factory(
        keys_config(tmp_path, model("m", route(fake_upstream, pricing=PRICING)))
    )
    key, _ = await new_key(gw)
    base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    call_delta = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": json.dumps({"x": "y" * 400})},
    }
    frames = [
        {
            **base,
            "choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [call_delta]}}],
        },
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    sse = "".join(f"data: {json.dumps(f)}\n\n" for f in frames) + "data: [DONE]\n\n"
    fake_upstream.enqueue(Reply(body=sse, headers={"content-type": "text/event-stream"}))
    stream = await gw.openai(key).chat.completions.create(model="m", messages=HI, stream=True)
    assert [c async for c in stream]
    (row,) = (await _admin(gw, "log", "query", kind="request"))["rows"]
    assert row["cost_estimated"] is True
    # Over 400 characters of arguments: over 100 completion tokens at 10 USD a million.
    assert row["cost_usd"] > 100 * 10.0 / 1e6


async def test_embeddings_an_upstream_reports_no_usage_for_are_billed_on_the_estimate(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    # Gemini's batchEmbedContents reports no usage: the adapter said 0 tokens, reported, so
    # they cost $0 and no budget counted them; and an embeddings request's prompt estimate
    # was 0, so an embedding marked estimated cost $0 too. The client, shown ``usage: null``
    # (OpenAI's is required), is shown that estimate.
    gemini = {
        "kind": "gemini",
        "base_url": fake_upstream.gemini_base_url,
        "provider_model_id": "text-embedding-004",
        "api_key": "gemini-route-secret",
        "pricing": PRICING,
    }
    gw = await gateway_factory(keys_config(tmp_path, model("e", gemini)))
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, budget="10/month")
    text = "the quick brown fox jumps over the lazy dog " * 20
    answer = await gw.openai(key).embeddings.create(model="e", input=[text, text])
    assert len(answer.data) == 2
    (row,) = (await _admin(gw, "log", "query", kind="request"))["rows"]
    assert row["cost_estimated"] is True
    # Two inputs of 880 characters, at 4 a token: 440 prompt tokens, what the client is shown.
    assert (row["prompt_tokens"], row["completion_tokens"]) == (440, 0)
    assert (answer.usage.prompt_tokens, answer.usage.total_tokens) == (440, 440)
    assert row["cost_usd"] == pytest.approx(row["prompt_tokens"] * 2.0 / 1e6)
    got = (await admin_http(gw).get(f"/admin/limits/key/{key_id}")).json()
    assert got["usage"]["spent_usd"] == pytest.approx(row["cost_usd"])


def _claude_cut_after_text(text: str) -> str:
    """A Claude stream whose ``message_start`` reported its input (100 fresh, 1000 read from
    the cache, 2000 written to it) and that ends after ``text``, before ``message_stop``."""
    usage = {
        "input_tokens": 100,
        "cache_read_input_tokens": 1000,
        "cache_creation_input_tokens": 2000,
        "output_tokens": 1,
    }
    message: dict[str, Any] = {"id": "msg_1", "type": "message", "role": "assistant"}
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {**message, "content": [], "usage": usage}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
    ]
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)


async def test_a_claude_stream_cut_or_left_is_billed_on_the_prompt_its_start_reported(
    gateway_factory: GatewayFactory,
    fake_upstreams: Any,
    tmp_path: Path,
) -> None:
    # It was billed on the body's bytes / 4 at the prompt price: 3,100 input tokens, 2,000
    # of them cache writes, cost about $0.00004 instead of $0.0087, and counted 20 on tpm.
    pricing = {**PRICING, "input_cache_writes": 4.0}
    up: FakeUpstream = await fake_upstreams(
        "up1", prompt_tokens=3000, cached_tokens=2000, text="Hello there"
    )
    gw = await gateway_factory(
        keys_config(tmp_path, model("m", anthropic_route(up, pricing=pricing)))
    )
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, tpm=1_000_000)
    up.enqueue(Reply(body=_claude_cut_after_text("Hello there"), headers=_SSE))
    up.enqueue(Stream(stall_after=1))
    async with (
        watch(gw, subjects.observation(eid("m", up))) as seen,
        watch(gw, subjects.LIMITS_SETTLE) as settles,
    ):
        with pytest.raises(anthropic.APIError):  # the upstream cut it
            async with gw.anthropic(key).messages.stream(
                model="m", max_tokens=100, messages=HI
            ) as cut:
                async for _ in cut:
                    pass
        cut_obs, cut_settle = await seen.next(Observation), await settles.next(LimitSettle)
        left = await gw.openai(key).chat.completions.create(model="m", messages=HI, stream=True)
        async for chunk in left:  # the client reads the first words, then goes away
            if chunk.choices and chunk.choices[0].delta.content:
                break
        await left.close()
        left_obs, left_settle = await seen.next(Observation), await settles.next(LimitSettle)
    # Cut: the prompt as reported, its cached and written parts at their prices, and the 11
    # characters it answered (3 tokens) on the estimate.
    cost = (100 * 2.0 + 1000 * 0.5 + 2000 * 4.0 + 3 * 10.0) / 1e6
    assert (cut_obs.outcome, cut_obs.cost_estimated) == ("failure", True)
    assert cut_obs.cost_usd == pytest.approx(cost)
    assert cut_settle.tokens == 3103 and cut_settle.cost_usd == pytest.approx(cost)
    # Left after "Hell" (4 characters, one chunk of three): 1000 fresh, 2000 read, 1 token.
    cost = (1000 * 2.0 + 2000 * 0.5 + 1 * 10.0) / 1e6
    assert (left_obs.outcome, left_obs.cost_estimated) == ("cancelled", True)
    assert left_obs.cost_usd == pytest.approx(cost)
    assert left_settle.tokens == 3001 and left_settle.cost_usd == pytest.approx(cost)


_HOUR_WRITES = {
    "input_tokens": 100,
    "cache_read_input_tokens": 1000,
    "cache_creation_input_tokens": 3000,
    "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000},
    "output_tokens": 2,
}


def _claude_answer(stream: bool) -> Reply:
    """Claude's answer "Hi." whose prompt wrote 1,000 tokens to the cache for 5 minutes and
    2,000 for an hour (:data:`_HOUR_WRITES`)."""
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "c"}
    if not stream:
        text = [{"type": "text", "text": "Hi."}]
        body = {**message, "content": text, "stop_reason": "end_turn", "usage": _HOUR_WRITES}
        return Reply(body=body)
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {**message, "content": [], "usage": _HOUR_WRITES}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi."}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": _HOUR_WRITES},
        {"type": "message_stop"},
    ]
    sse = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
    return Reply(body=sse, headers=_SSE)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_claudes_one_hour_cache_writes_are_billed_at_their_own_price(
    gateway_factory: GatewayFactory,
    fake_upstreams: Any,
    tmp_path: Path,
    stream: bool,
) -> None:
    # They were billed at the 5-minute write price: Claude bills 1-hour writes at 2x the
    # input price, 5-minute ones at 1.25x.
    pricing = {**PRICING, "input_cache_writes": 2.5, "input_cache_writes_1h": 4.0}
    up: FakeUpstream = await fake_upstreams("claude")
    gw = await gateway_factory(
        keys_config(tmp_path, model("m", anthropic_route(up, pricing=pricing)))
    )
    key, _ = await new_key(gw)
    up.enqueue(_claude_answer(stream))
    client = gw.anthropic(key)
    if stream:
        async with client.messages.stream(model="m", max_tokens=10, messages=HI) as events:
            usage = (await events.get_final_message()).usage
    else:
        usage = (await client.messages.create(model="m", max_tokens=10, messages=HI)).usage
    cost = (100 * 2.0 + 1000 * 0.5 + 1000 * 2.5 + 2000 * 4.0 + 2 * 10.0) / 1e6
    for row in (await _admin(gw, "log", "query"))["rows"]:  # the request and its attempt
        assert row["cost_usd"] == pytest.approx(cost) and not row["cost_estimated"]
        assert (row["prompt_tokens"], row["completion_tokens"]) == (4100, 2)
    # The Messages client gets Claude's split of the writes too.
    assert usage.cache_creation_input_tokens == 3000
    assert usage.cache_creation is not None
    assert usage.cache_creation.ephemeral_1h_input_tokens == 2000
    assert usage.cache_creation.ephemeral_5m_input_tokens == 1000


async def _thoughts_then_good(
    fake_upstreams: Any, tmp_path: Path, stream: bool
) -> tuple[FakeUpstream, FakeUpstream, Any]:
    """A model whose Gemini route (drawn first) answers only its thoughts (7 prompt and 5
    thinking tokens, billed: an answer the gateway refuses) and whose fallback serves (10
    prompt, 5 completion, 4 cached): both upstreams and the keys config."""
    gemini: FakeUpstream = await fake_upstreams("gem")
    thought = {"text": "the user wants the weather", "thought": True}
    empty = {
        "candidates": [{"content": {"role": "model", "parts": [thought]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 7, "thoughtsTokenCount": 5},
    }
    sse = Reply(body=f"data: {json.dumps(empty)}\n\n", headers=_SSE)
    gemini.set_default(sse if stream else Reply(body=empty))
    good: FakeUpstream = await fake_upstreams(
        "good", prompt_tokens=10, completion_tokens=5, cached_tokens=4
    )
    gemini_route = {
        "kind": "gemini",
        "base_url": gemini.gemini_base_url,
        "provider_model_id": "g",
        "api_key": "k",
        "pricing": PRICING,
    }
    tiny = 1e-6  # the fallback's weight: the draw picks Gemini first
    conf = keys_config(tmp_path, model("m", gemini_route, route(good, tiny, pricing=PRICING)))
    return gemini, good, conf


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_an_answer_refused_as_unusable_is_billed_on_the_usage_it_reported(
    gateway_factory: GatewayFactory,
    fake_upstreams: Any,
    tmp_path: Path,
    stream: bool,
) -> None:
    # Gemini answered 200 with only its thoughts (7 prompt and 5 thinking tokens, billed):
    # the gateway failed over, as it must, and billed that attempt $0.
    gemini, good, conf = await _thoughts_then_good(fake_upstreams, tmp_path, stream)
    gw = await gateway_factory(conf)
    key, key_id = await new_key(gw)
    await set_limit(gw, "key", key_id, tpm=1_000_000)
    async with (
        watch(gw, subjects.observation(eid("m", gemini))) as seen,
        watch(gw, subjects.LIMITS_SETTLE) as settles,
    ):
        if stream:
            chunks = await gw.openai(key).chat.completions.create(
                model="m", messages=HI, stream=True
            )
            assert [c async for c in chunks]
        else:
            assert (await call(gw, "chat", key)).status == 200
        refused, settled = await seen.next(Observation), await settles.next(LimitSettle)
    thought_cost = (7 * 2.0 + 5 * 10.0) / 1e6
    assert (refused.outcome, refused.error_kind) == ("client_error", "bad_response")
    assert (refused.prompt_tokens, refused.completion_tokens) == (7, 5)
    assert refused.cost_usd == pytest.approx(thought_cost) and not refused.cost_estimated
    assert settled.tokens == 12 + 15
    assert settled.cost_usd == pytest.approx(thought_cost + COST)
    assert len(gemini.requests) == 1 and len(good.requests) == 1


async def test_a_failed_over_requests_row_counts_every_attempts_tokens_as_its_cost_does(
    gateway_factory: GatewayFactory,
    fake_upstreams: Any,
    tmp_path: Path,
) -> None:
    # Gemini's answer of only thoughts (7 prompt, 5 thinking tokens) was billed, then the
    # request failed over: the row's tokens showed the last attempt's 10 and 5 beside the cost
    # of both, and the spend report and llmgw_tokens_total left the first attempt's out.
    gemini, good, conf = await _thoughts_then_good(fake_upstreams, tmp_path, stream=False)
    gw = await gateway_factory(conf)
    key, _ = await new_key(gw)
    assert (await call(gw, "chat", key)).status == 200

    cost = (7 * 2.0 + 5 * 10.0) / 1e6 + COST
    (row,) = (await _admin(gw, "log", "query", kind="request"))["rows"]
    assert (row["attempt"], row["endpoint"]) == (2, eid("m", good))
    assert row["cost_usd"] == pytest.approx(cost)
    assert (row["prompt_tokens"], row["completion_tokens"], row["cached_tokens"]) == (17, 10, 4)
    attempts = (await _admin(gw, "log", "query", kind="attempt"))["rows"]
    own = {r["endpoint"]: (r["prompt_tokens"], r["completion_tokens"]) for r in attempts}
    assert own == {eid("m", gemini): (7, 5), eid("m", good): (10, 5)}
    (group,) = (await _admin(gw, "spend", "report", group_by="model"))["groups"]
    assert (group["prompt_tokens"], group["completion_tokens"]) == (17, 10)
    assert group["cost_usd"] == pytest.approx(cost)
    # /metrics counts each attempt's tokens on the endpoint that used them.
    text = (await admin_http(gw).get("/metrics")).text
    counted = {  # label sets (in whatever order the exposition writes them) -> value
        frozenset(ln[ln.index("{") + 1 : ln.index("}")].split(",")): float(ln.rsplit(" ", 1)[1])
        for ln in text.splitlines()
        if ln.startswith("llmgw_tokens_total{")
    }
    for endpoint, (prompt, completion) in own.items():
        for kind, n in (("prompt", prompt), ("completion", completion)):
            labels = frozenset(('model="m"', f'endpoint="{endpoint}"', f'kind="{kind}"'))
            assert counted.get(labels) == n, counted


async def test_the_cli_sets_limits_and_reports_spend_through_the_local_socket(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    cfg = keys_config(tmp_path, model("m", route(fake_upstream, pricing=PRICING)))
    gw = await gateway_factory(cfg)
    # The key over the admin API: each CLI child costs seconds on a loaded machine, and the
    # test's own three must fit in its time with the gateway's start and stop.
    made = await _admin(gw, "api_keys", "create", org="acme", user="alice", role="pro")
    key, key_id = made["key"], made["id"]
    conf = tmp_path / "cli.yaml"
    conf.write_text(yaml.safe_dump({"database": cfg["database"]}))

    async def llmgw(*args: str) -> Any:
        code, out, err = await admin_cli(conf, *args)
        assert code == 0, err
        return json.loads(out)

    await llmgw("limits", "set", "--arg", f"subject=key:{key_id}", "--arg", "rpm=1")
    assert (await call(gw, "chat", key)).status == 200
    assert (await call(gw, "chat", key)).status == 429
    report = await llmgw("spend", "report", "--arg", "group_by=key")
    (row,) = report["groups"]
    assert (row["key"], row["requests"]) == (key_id, 2)  # the refusal is a request, at $0
    assert row["cost_usd"] == pytest.approx((10 * 2.0 + 5 * 10.0) / 1e6)
    got = await llmgw("limits", "get", "--arg", f"subject=key:{key_id}")
    assert got["usage"]["requests_last_minute"] == 1


async def test_the_cli_reports_spend_from_a_stopped_gateways_database(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    cfg = keys_config(tmp_path, model("m", route(fake_upstream, pricing=PRICING)))
    gw = await gateway_factory(cfg)
    key, key_id = await new_key(gw, org="acme", user="alice")
    assert (await call(gw, "chat", key)).status == 200
    assert await gw.stop() == 0  # the request log is written out on the way down
    conf = tmp_path / "cli.yaml"
    conf.write_text(yaml.safe_dump({"database": cfg["database"]}))

    def report(*args: str) -> Any:
        return admin_cli(conf, "spend", "report", *args)

    code, out, err = await report("--arg", "group_by=key")
    assert code == 0, err
    (row,) = json.loads(out)["groups"]
    assert (row["key"], row["requests"]) == (key_id, 1)

    # It was "spend report not delivered: ...", as if no gateway had answered.
    code, out, err = await report("--arg", "since=nan")
    assert (code, out) == (1, "")
    assert "spend report refused: 'since'" in err, err
