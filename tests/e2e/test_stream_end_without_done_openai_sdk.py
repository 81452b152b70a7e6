"""A chat stream whose HTTP answer ends cleanly after its finish reason but without
``data: [DONE]`` is a whole answer; one cut short, or ending without a finish reason, is not.

Some OpenAI-compatible servers close their stream after the finish chunk without the
``[DONE]`` line. The body ended as HTTP says it ends (its chunked terminator, or its
Content-Length met): the client gets a normal end, the route a success (its usage estimated
when no usage chunk came), not a failure that opened its circuit after two. A connection cut
before the body's end stays a broken stream. Through the official ``openai`` SDK, against an
upstream writing raw bytes, on the in-process bus.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import openai
import pytest

from schemas import Observation, subjects
from tests.e2e.conftest import HI, ONE_BUS, config, model, watch
from tests.fixtures.raw_upstream import RawReply, ok

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.raw_upstream import RawUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "x"}
SSE = "Content-Type: text/event-stream"


def _events(finish: str | None, *, second: str | None = None) -> bytes:
    """Choice 0 says "Hello" and ends with ``finish``; with ``second``, choice 1 says it too
    (and ends with ``second``'s finish reason, unless that is empty)."""
    deltas: list[tuple[int, dict[str, Any], str | None]] = [
        (0, {"role": "assistant", "content": "Hel"}, None),
        (0, {"content": "lo"}, None),
        (0, {}, finish),
    ]
    if second is not None:
        deltas += [(1, {"role": "assistant", "content": "Hello"}, second or None)]
    chunks = [
        {**BASE, "choices": [{"index": index, "delta": delta, "finish_reason": why}]}
        for index, delta, why in deltas
    ]
    return b"".join(b"data: %b\n\n" % json.dumps(chunk).encode() for chunk in chunks)


def _chunked(body: bytes, *, terminated: bool) -> bytes:
    head = f"HTTP/1.1 200 OK\r\n{SSE}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    return head + b"%x\r\n%b\r\n" % (len(body), body) + (b"0\r\n\r\n" if terminated else b"")


async def _gateway(gateway_factory: GatewayFactory, raw: RawUpstream) -> RunningGateway:
    raw_route = {
        "kind": "openai_compat",
        "base_url": f"http://127.0.0.1:{raw.port}/v1",
        "provider_model_id": "raw-model",
    }
    return await gateway_factory(config(model("m", raw_route)))


async def _stream(gw: RunningGateway, n: int = 1) -> tuple[str, list[str | None]]:
    chunks = await gw.openai().chat.completions.create(model="m", messages=HI, stream=True, n=n)
    text, reasons = "", []
    async for chunk in chunks:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            reasons.append(choice.finish_reason)
    return text, [r for r in reasons if r]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_stream_ended_cleanly_after_its_finish_reason_without_done_is_whole(
    gateway_factory: GatewayFactory, raw_upstream: RawUpstream, framing: str
) -> None:
    body = _events("stop")
    answer = ok(body, SSE) if framing == "content-length" else _chunked(body, terminated=True)
    two = _chunked(_events("stop", second="length"), terminated=True)
    raw_upstream.enqueue(*[RawReply(answer, close=True)] * 2, RawReply(two, close=True))
    gw = await _gateway(gateway_factory, raw_upstream)

    async with watch(gw, subjects.OBSERVATION_ANY) as obs:
        answers = [await _stream(gw) for _ in range(2)]  # two failures opened the circuit
        answers.append(await _stream(gw, n=2))
        seen = [await obs.next(Observation) for _ in range(3)]

    assert answers == [("Hello", ["stop"])] * 2 + [("HelloHello", ["stop", "length"])]
    assert [(o.outcome, o.error_kind, o.cost_estimated) for o in seen] == [
        ("success", "", True)
    ] * 3


@pytest.mark.parametrize(
    ("answer", "n", "why"),
    [
        (_chunked(_events("stop"), terminated=False), 1, "ConnectionResetError"),
        (_chunked(_events(None), terminated=True), 1, "without a finish reason"),
        (_chunked(_events("stop", second=""), terminated=True), 2, "every choice"),
    ],
    ids=["cut-after-the-finish-reason", "no-finish-reason", "one-of-two-choices-unfinished"],
)
async def test_a_cut_stream_or_one_without_every_finish_reason_is_still_broken(
    gateway_factory: GatewayFactory, raw_upstream: RawUpstream, answer: bytes, n: int, why: str
) -> None:
    raw_upstream.enqueue(RawReply(answer, close=True))
    gw = await _gateway(gateway_factory, raw_upstream)

    async with watch(gw, subjects.OBSERVATION_ANY) as obs:
        with pytest.raises(openai.APIError) as err:
            await _stream(gw, n)
        seen = await obs.next(Observation)

    assert why in str(err.value)
    assert seen.outcome == "failure"
