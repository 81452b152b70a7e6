"""Pacing through the real server with the openai SDK, on both buses: a route whose answers
(streamed or whole) report its provider's request rate limit (OpenAI's
``x-ratelimit-{limit,remaining,reset}-requests``, Anthropic's ``anthropic-ratelimit-
requests-*``) is sent no request once the requests that limit has left are spent: the next
goes to the fallback instead of drawing the provider's 429, and ``/health/deep`` says until
when.

The fake provider enforces a real limit of two requests on loopback (its clock stands still:
its second never ends), and its answers report a limit of two, one back every 10 s (so that
nothing here races a refill); the three requests are sent one after another, so nothing waits
on time.
"""

from __future__ import annotations

import datetime
import time
from typing import TYPE_CHECKING, Any

import openai
import pytest

from schemas import Observation, subjects
from tests.e2e.conftest import HI, anthropic_route, config, eid, model, route, watch
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = pytest.mark.e2e


def _reported(remaining: int, kind: str) -> Reply:
    """The normal answer, reporting a limit of 2 with ``remaining`` left, one coming back
    every 10 s, as ``kind``'s provider does (OpenAI: when all is back, a duration;
    Anthropic: a time)."""
    all_back = (2 - remaining) * 10
    if kind == "anthropic":
        back = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=all_back)
        headers = {
            "anthropic-ratelimit-requests-limit": "2",
            "anthropic-ratelimit-requests-remaining": str(remaining),
            "anthropic-ratelimit-requests-reset": back.isoformat(),
        }
    else:
        headers = {
            "x-ratelimit-limit-requests": "2",
            "x-ratelimit-remaining-requests": str(remaining),
            "x-ratelimit-reset-requests": f"{all_back}s",
        }
    return Reply(headers=headers)


# Paced and unpaced, streamed and whole, on an OpenAI-compatible and an Anthropic route.
CASES = pytest.mark.parametrize(
    ("pacing", "stream", "kind"),
    [
        (True, True, "openai_compat"),
        (True, False, "openai_compat"),
        (False, True, "openai_compat"),
        (True, True, "anthropic"),
        (True, False, "anthropic"),
    ],
)


@CASES
async def test_a_route_whose_reported_limit_is_spent_is_passed_over_before_its_provider_refuses(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    pacing: bool,
    stream: bool,
    kind: str,
) -> None:
    paced = await fake_upstreams("paced", rate_limit=2, clock=lambda: 0.0)  # one long second
    # Only the first answer reports (one left after it); the second says nothing: paced, the
    # second request took the one left; unpaced, nothing says so.
    paced.enqueue(_reported(1, kind), Reply())
    spare = await fake_upstreams("spare")
    first = anthropic_route(paced) if kind == "anthropic" else route(paced)
    cfg = config(model("m", first, route(spare, fallback_only=True)))
    cfg["routing"] = {"learned_capacity": {"pace_rate_limits": pacing}}
    gw = await gateway_factory(cfg)
    client = gw.openai()

    served = [await _routed_via(client, HI, stream) for _ in range(3)]
    deep = (await gw.http().get("/health/deep")).json()
    paced_load = deep["load"]["m"][served[0]]

    assert served[:2] == [served[0]] * 2 and served[2] != served[0]
    # Paced, the third request never reached the provider; unpaced, it drew the 429 first.
    assert len(paced.refused) == (0 if pacing else 1)
    assert len(paced.requests) - len(paced.refused) == 2 and len(spare.requests) == 1
    # Operators see until when: the next request comes back within 10 s.
    if pacing:
        # (+1: an Anthropic reset is read against the answer's Date, to the second.)
        assert time.time() < paced_load["rate_limit_until"] <= time.time() + 11.0
    else:
        assert paced_load["rate_limit_until"] is None


@pytest.mark.parametrize("pacing", [True, False])
async def test_an_embeddings_route_whose_reported_limit_is_spent_is_passed_over(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, pacing: bool
) -> None:
    # Before, an embeddings answer's report was not read: the third request drew the 429.
    paced = await fake_upstreams("paced", rate_limit=2, clock=lambda: 0.0)  # one long second
    paced.enqueue(_reported(1, "openai_compat"), Reply())
    spare = await fake_upstreams("spare")
    cfg = config(model("e", route(paced), route(spare, fallback_only=True)))
    cfg["routing"] = {"learned_capacity": {"pace_rate_limits": pacing}}
    gw = await gateway_factory(cfg)
    client = gw.openai()

    served = []
    for _ in range(3):
        raw = await client.embeddings.with_raw_response.create(model="e", input="hello")
        served.append(raw.headers["x-routed-via"])
        assert raw.parse().data[0].embedding  # the answer, not the marker, reaches the client
    deep = (await gw.http().get("/health/deep")).json()

    assert served[:2] == [served[0]] * 2 and served[2] != served[0]
    assert len(paced.refused) == (0 if pacing else 1)
    assert len(spare.requests) == 1
    limited_until = deep["load"]["e"][served[0]]["rate_limit_until"]
    assert (limited_until is not None) == pacing


async def test_an_embeddings_request_larger_than_the_tokens_a_route_has_left_goes_elsewhere(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    # Before, an embeddings request took nothing of a token limit: it was sent where its
    # input did not fit, and drew the provider's 429.
    paced = await fake_upstreams("paced")
    tokens_left = {
        "x-ratelimit-limit-requests": "100",
        "x-ratelimit-remaining-requests": "99",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "10000",
        "x-ratelimit-remaining-tokens": "600",  # 15.7 tokens back a second
        "x-ratelimit-reset-tokens": "600s",
    }
    paced.set_default(Reply(headers=tokens_left))
    spare = await fake_upstreams("spare")
    gw = await gateway_factory(config(model("e", route(paced), route(spare, fallback_only=True))))
    client = gw.openai()

    served = []
    for text in ("hi", "x" * 4_000, "hi"):  # about 1, 1,000 and 1 tokens
        raw = await client.embeddings.with_raw_response.create(model="e", input=text)
        served.append(raw.headers["x-routed-via"])

    assert served == [served[0], served[1], served[0]] and served[1] != served[0]
    assert len(spare.requests) == 1


async def test_an_upstreams_own_key_named_as_the_private_marker_is_neither_relayed_nor_trusted(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    up = await fake_upstreams("odd")
    answer = {
        "id": "chatcmpl-odd",
        "object": "chat.completion",
        "created": 0,
        "model": "odd-model",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        "_rate_report": 5,  # not a report: what an upstream sends is never the gateway's marker
    }
    up.enqueue(Reply(body=answer))
    gw = await gateway_factory(config(model("m", route(up))))

    async with watch(gw, subjects.observation(eid("m", up))) as observations:
        raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=HI)
        # Observed (over NATS a report of the wrong type would not even encode: lost).
        seen = await observations.next(Observation)

    assert "_rate_report" not in raw.text and raw.parse().choices[0].message.content == "hi"
    assert seen.outcome == "success" and seen.rate is None


def _tokens_reported(kind: str) -> Reply:
    """The normal answer, reporting requests to spare but a token limit of 1,000 with 500
    left, all of it back in a minute (a token every 0.1 s: nothing here races a refill)."""
    if kind == "anthropic":
        back = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=57)
        headers = {
            "anthropic-ratelimit-requests-limit": "100",
            "anthropic-ratelimit-requests-remaining": "99",
            "anthropic-ratelimit-requests-reset": back.isoformat(),
            "anthropic-ratelimit-tokens-limit": "1000",
            "anthropic-ratelimit-tokens-remaining": "500",
            "anthropic-ratelimit-tokens-reset": back.isoformat(),
        }
    else:
        headers = {
            "x-ratelimit-limit-requests": "100",
            "x-ratelimit-remaining-requests": "99",
            "x-ratelimit-reset-requests": "600ms",
            "x-ratelimit-limit-tokens": "1000",
            "x-ratelimit-remaining-tokens": "500",
            "x-ratelimit-reset-tokens": "57s",
        }
    return Reply(headers=headers)


LONG = [{"role": "user", "content": "lorem ipsum " * 1000}]  # some 3,000 tokens: over 500


@CASES
async def test_a_request_larger_than_a_routes_reported_token_limit_has_left_is_sent_elsewhere(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    pacing: bool,
    stream: bool,
    kind: str,
) -> None:
    paced = await fake_upstreams("tokens")
    # The first answer reports 500 tokens left: a short request still fits; a long one does
    # not, nor a short one whose max_tokens the provider would reserve of them.
    paced.enqueue(_tokens_reported(kind), Reply(), Reply(), Reply())
    spare = await fake_upstreams("spare")
    first = anthropic_route(paced) if kind == "anthropic" else route(paced)
    cfg = config(model("m", first, route(spare, fallback_only=True)))
    cfg["routing"] = {"learned_capacity": {"pace_rate_limits": pacing}}
    gw = await gateway_factory(cfg)
    client = gw.openai()

    # The cap of 400 fits, and takes 400 of what is left: one of 300 no longer fits (some
    # 100 are left, a token back every 0.11 s).
    sent = ((HI, None), (HI, 600), (HI, 400), (HI, 300), (LONG, None))
    served = [await _routed_via(client, messages, stream, cap) for messages, cap in sent]

    if pacing:  # the provider would refuse the second and the last two
        paced_via, spare_via = served[0], served[1]
        assert served == [paced_via, spare_via, paced_via, spare_via, spare_via]
        assert paced_via != spare_via
        assert len(paced.requests) == 2 and len(spare.requests) == 3
    else:  # unpaced, only a report of none left would have spent the route
        assert served == [served[0]] * 5 and not spare.requests


def _output_apart() -> Reply:
    """An Anthropic answer reporting its input and output token limits apart: 9,000 input
    tokens of 10,000 left and 5,000 output of 10,000 (together 14,000 of 20,000), all back
    in a minute."""
    back = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=57)).isoformat()
    headers: dict[str, str] = {}
    limits = (
        ("requests", 100, 99),
        ("tokens", 20_000, 14_000),
        ("input-tokens", 10_000, 9_000),
        ("output-tokens", 10_000, 5_000),
    )
    for unit, limit, left in limits:
        headers[f"anthropic-ratelimit-{unit}-limit"] = str(limit)
        headers[f"anthropic-ratelimit-{unit}-remaining"] = str(left)
        headers[f"anthropic-ratelimit-{unit}-reset"] = back
    return Reply(headers=headers)


@pytest.mark.parametrize("stream", [True, False])
async def test_a_request_whose_output_cap_an_anthropic_routes_output_limit_lacks_goes_elsewhere(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, stream: bool
) -> None:
    paced = await fake_upstreams("claude")
    paced.enqueue(_output_apart(), Reply(), Reply())
    spare = await fake_upstreams("spare")
    cfg = config(model("m", anthropic_route(paced), route(spare, fallback_only=True)))
    gw = await gateway_factory(cfg)
    client = gw.openai()

    # Without a cap, the route is sent Claude's default max_tokens (4,096), which Claude
    # reserves, and a high reasoning effort's budget on top (8,192: more than the 5,000
    # left). A long prompt fits both limits, leaving some 6,000 input and 900 output. A cap
    # of 2,500 then fits what is left together (6,900), not the output (one comes back every
    # 11 ms: 18 s away); one of 200 does, and no cap (4,096) no longer does.
    sent = ((HI, None), (HI, "high"), (LONG, None), (HI, 2_500), (HI, 200), (HI, None))
    served = [
        await _routed_via(client, messages, stream, *_cap_or_effort(asked))
        for messages, asked in sent
    ]

    claude, elsewhere = served[0], served[1]
    assert served == [claude, elsewhere, claude, elsewhere, claude, elsewhere]
    assert claude != elsewhere and len(paced.requests) == 3 and len(spare.requests) == 3


def _cap_or_effort(asked: int | str | None) -> tuple[int | None, str | None]:
    return (asked, None) if not isinstance(asked, str) else (None, asked)


async def _routed_via(
    client: openai.AsyncOpenAI,
    messages: Any,
    stream: bool,
    max_tokens: int | None = None,
    effort: str | None = None,
) -> str:
    """The route that served one chat completion of ``messages`` (read to its end)."""
    capped = openai.omit if max_tokens is None else max_tokens
    thinking: Any = openai.omit if effort is None else effort
    if stream:
        chunks = await client.chat.completions.with_raw_response.create(
            model="m", messages=messages, stream=True, max_tokens=capped, reasoning_effort=thinking
        )
        async for _chunk in chunks.parse():
            pass
        return chunks.headers["x-routed-via"]
    whole = await client.chat.completions.with_raw_response.create(
        model="m", messages=messages, max_tokens=capped, reasoning_effort=thinking
    )
    assert "_rate_report" not in whole.text  # the marker never reaches the client
    return whole.headers["x-routed-via"]
