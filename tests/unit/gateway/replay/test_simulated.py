"""The simulated upstream: capacity queueing, rate limits answered like a provider, outages;
on a virtual loop, so every time here is exact."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator
from typing import Any, cast

import pytest
from pydantic import ValidationError

from gateway.adapters.base import Batch, UpstreamTarget
from gateway.replay.providers import ProvidersFile
from gateway.replay.simulated import SimulatedAdapter
from gateway.replay.vloop import run_virtual
from schemas import QUOTA_EXHAUSTED, RATE_LIMIT_EXCEEDED, UpstreamError
from schemas.canonical_markers import RATE_REPORT
from schemas.config import credential_id
from schemas.routing import RateReport

TARGET = UpstreamTarget(
    endpoint="m:p", kind="openai_compat", base_url="http://p/v1", upstream_model="x",
    api_key=None, timeout=600, connect_timeout=10,
)  # fmt: skip
BODY = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 11}


def _sim(**provider: Any) -> SimulatedAdapter:
    # A steady TTFT of 1 s and 10 tokens a second: an answer of 11 tokens takes 2 s.
    spec = {"endpoint": "m:p", "ttft": {"median": 1.0, "p90": 1.0}, "output_tps": 10, **provider}
    loop = asyncio.get_running_loop()
    providers = ProvidersFile.model_validate({"providers": [spec]})
    return SimulatedAdapter(providers, 1, loop.time, loop.time())


def test_past_its_capacity_a_route_queues_requests_in_arrival_order() -> None:
    async def scenario() -> list[float]:
        sim, loop = _sim(capacity=1), asyncio.get_running_loop()
        start = loop.time()

        async def one() -> float:
            await sim.complete(TARGET, BODY)
            return loop.time() - start

        return list(await asyncio.gather(one(), one(), one()))

    assert run_virtual(scenario()) == [2.0, 4.0, 6.0]


def test_a_cancelled_queued_request_gives_its_turn_to_the_next() -> None:
    async def scenario() -> float:
        sim, loop = _sim(capacity=1), asyncio.get_running_loop()
        start = loop.time()
        first = asyncio.create_task(sim.complete(TARGET, BODY))
        second = asyncio.create_task(sim.complete(TARGET, BODY))
        await asyncio.sleep(0.5)  # virtual time: the second is queued behind the first
        second.cancel()
        await sim.complete(TARGET, BODY)  # third: waits for the first only
        await first
        assert second.cancelled()
        return loop.time() - start

    assert run_virtual(scenario()) == 4.0


def test_beyond_its_rate_limit_a_route_answers_429_with_retry_after() -> None:
    async def burst() -> UpstreamError:
        sim = _sim(rate_limit={"requests": 2, "per_seconds": 1.0})
        served = [asyncio.create_task(sim.complete(TARGET, BODY)) for _ in range(2)]
        await asyncio.sleep(0)  # both admitted: the window is full
        with pytest.raises(UpstreamError) as refused:
            await sim.complete(TARGET, BODY)
        await asyncio.gather(*served)
        await sim.complete(TARGET, BODY)  # 2 s later the window has room again
        return refused.value

    err = run_virtual(burst())
    assert (err.status, err.kind, err.retry_after) == (429, RATE_LIMIT_EXCEEDED, 1.0)


def test_a_bucket_rate_limit_refills_evenly_and_each_stream_reports_what_is_left() -> None:
    async def scenario() -> tuple[list[Any], RateReport | None]:
        sim = _sim(rate_limit={"requests": 4, "per_seconds": 2.0, "kind": "bucket"})
        streams = [cast("AsyncGenerator[Batch]", sim.stream(TARGET, BODY)) for _ in range(6)]
        # Five at once from a full bucket of four: the fifth is refused.
        burst = await asyncio.gather(*(anext(s) for s in streams[:5]), return_exceptions=True)
        # A second later (the TTFT) two have refilled (one every half second): one is taken.
        later = await anext(streams[5])
        for stream in streams:
            await stream.aclose()
        return [b.rate if isinstance(b, Batch) else b for b in burst], later.rate

    burst, later = run_virtual(scenario())
    assert burst[:4] == [
        RateReport(limit=4, remaining=left, reset_seconds=(4 - left) / 2) for left in (3, 2, 1, 0)
    ]
    assert isinstance(burst[4], UpstreamError) and burst[4].status == 429
    assert later == RateReport(limit=4, remaining=1, reset_seconds=1.5)


def test_a_whole_answer_reports_its_request_limit_as_the_adapter_would() -> None:
    async def one() -> dict[str, Any]:
        sim = _sim(rate_limit={"requests": 4, "per_seconds": 2.0, "kind": "bucket"})
        return await sim.complete(TARGET, BODY)

    answer = run_virtual(one())
    assert answer[RATE_REPORT] == RateReport(limit=4, remaining=3, reset_seconds=0.5)


def test_a_bucket_token_limit_is_reported_with_the_request_limit() -> None:
    # 1,000 tokens a 2 s bucket; a request takes its 100 prompt tokens and 11 output ones.
    limit = {"requests": 100, "tokens": 1_000, "per_seconds": 2.0, "kind": "bucket"}

    async def scenario() -> list[Any]:
        sim = _sim(rate_limit=limit)
        # Ten at once: nine take 999 tokens, the tenth does not fit in the one left.
        calls = (sim.complete(TARGET, BODY) for _ in range(10))
        return await asyncio.gather(*calls, return_exceptions=True)

    answers = run_virtual(scenario())
    reports = [a[RATE_REPORT] for a in answers[:9]]
    assert [r.tokens for r in reports] == [
        RateReport(limit=1_000, remaining=1_000 - 111 * n, reset_seconds=111 * n / 500)
        for n in range(1, 10)
    ]
    assert [(r.limit, r.remaining) for r in reports] == [(100, 100 - n) for n in range(1, 10)]
    refused = answers[9]
    assert isinstance(refused, UpstreamError) and refused.status == 429
    assert refused.kind == "rate_limit_exceeded"  # it said which: a pace, not a concurrency


def test_a_token_limit_reserves_max_tokens_while_the_answer_runs_and_gets_back_the_rest() -> None:
    # A bucket of 1,000 tokens refilling 50 a second; the prompt opens with the answer's
    # length (11 tokens) and the client caps it at 400: 100 + 400 are reserved, 389 come
    # back at its end.
    limit = {"requests": 100, "tokens": 1_000, "per_seconds": 20.0, "kind": "bucket"}
    capped = {**BODY, "messages": [{"role": "user", "content": "11 " + "x" * 397}]}
    capped["max_tokens"] = 400

    async def scenario() -> tuple[list[Any], RateReport]:
        sim = _sim(rate_limit=limit)
        # Three at once: two reserve 1,000; the third does not fit while they run.
        calls = (sim.complete(TARGET, capped) for _ in range(3))
        first = await asyncio.gather(*calls, return_exceptions=True)
        # They ended 2 s later: what they did not use is back, with 100 refilled.
        after = await sim.complete(TARGET, BODY)
        return first, after[RATE_REPORT]

    first, after = run_virtual(scenario())
    assert [a[RATE_REPORT].tokens.remaining for a in first[:2]] == [500, 0]
    assert [a["usage"]["completion_tokens"] for a in first[:2]] == [11, 11]
    assert isinstance(first[2], UpstreamError) and first[2].status == 429
    assert after.tokens is not None and after.tokens.remaining == 100 + 2 * 389 - 111


def test_a_window_token_limit_gets_back_what_answers_admitted_together_did_not_use() -> None:
    limit = {"requests": 100, "tokens": 2_000, "per_seconds": 60.0}  # a sliding window

    def asked(length: str, cap: int) -> dict[str, Any]:  # a 100-token prompt
        return {**BODY, "messages": [{"role": "user", "content": length.ljust(400, "x")}],
                "max_tokens": cap}  # fmt: skip

    large, small = asked("11 ", 1_000), asked("5 ", 400)

    async def scenario() -> tuple[list[Any], RateReport]:
        sim = _sim(rate_limit=limit)
        # Admitted at the same instant, the larger first; the smaller one ends first (5
        # tokens against 11): its give-back must not be taken from the larger's reservation.
        first = await asyncio.gather(
            sim.complete(TARGET, large),
            sim.complete(TARGET, small),
            sim.complete(TARGET, small),
            return_exceptions=True,
        )
        return list(first), (await sim.complete(TARGET, BODY))[RATE_REPORT]

    first, after = run_virtual(scenario())
    # 1,100 and 500 reserved, 400 left: the third does not fit.
    assert isinstance(first[2], UpstreamError) and first[2].status == 429
    # Both ended having used 111 and 105: those stay in the window, and this one's 111.
    assert after.tokens is not None and after.tokens.remaining == 2_000 - 216 - 111


def test_an_output_limit_apart_reserves_the_cap_or_claudes_default_and_reports_apart() -> None:
    # Input 1,000 and output 5,000 tokens a 20 s bucket; an anthropic route is sent 4,096
    # without a cap, which its output limit reserves as it would a cap.
    claude = dataclasses.replace(TARGET, kind="anthropic")
    uncapped = {k: v for k, v in BODY.items() if k != "max_tokens"}
    uncapped["messages"] = [{"role": "user", "content": "11 " + "x" * 397}]
    capped = {**uncapped, "max_tokens": 400}

    async def scenario(apart: bool) -> list[Any]:
        rate = {"requests": 100, "tokens": 1_000, "output_tokens": 5_000, "per_seconds": 20.0}
        sim = _sim(rate_limit={**rate, "kind": "bucket", "report_apart": apart})
        calls = (sim.complete(claude, body) for body in (capped, capped, uncapped, capped))
        return list(await asyncio.gather(*calls, return_exceptions=True))

    answers = run_virtual(scenario(apart=True))
    reports = [a[RATE_REPORT] for a in answers[:3]]
    assert [(r.tokens.remaining, r.output_tokens.remaining) for r in reports] == [
        (900, 4_600),
        (800, 4_200),
        (700, 104),
    ]
    assert reports[0].output_tokens == RateReport(limit=5_000, remaining=4_600, reset_seconds=1.6)
    # The fourth's 400 do not fit the output left, though the input has 700.
    assert isinstance(answers[3], UpstreamError) and answers[3].status == 429
    together = run_virtual(scenario(apart=False))[0][RATE_REPORT]
    assert together.output_tokens is None  # only their sum, as Anthropic's combined headers
    assert together.tokens == RateReport(limit=6_000, remaining=5_500, reset_seconds=2.0)


def test_in_an_outage_window_a_route_refuses_connections() -> None:
    async def scenario() -> UpstreamError:
        sim = _sim(outages=[{"start": 0, "end": 10, "kind": "connect"}])
        with pytest.raises(UpstreamError) as refused:
            await sim.complete(TARGET, BODY)
        await asyncio.sleep(10)  # virtual time: the outage passes, the behaviour under test
        await sim.complete(TARGET, BODY)  # the window is over
        return refused.value

    assert run_virtual(scenario()).kind == "connect"


def _keyed(key: str) -> UpstreamTarget:
    return dataclasses.replace(TARGET, api_key=key)


def test_a_spent_quota_plan_answers_insufficient_quota_until_its_next_period() -> None:
    async def scenario() -> UpstreamError:
        sim, loop = _sim(quota={"requests": 2, "period_seconds": 60}), asyncio.get_running_loop()
        start = loop.time()
        for _ in range(2):
            await sim.complete(_keyed("sk-a"), BODY)
        with pytest.raises(UpstreamError) as spent:
            await sim.complete(_keyed("sk-a"), BODY)
        await sim.complete(_keyed("sk-b"), BODY)  # each credential has its own plan
        await asyncio.sleep(start + 60 - loop.time())  # virtual time: to the next period
        await sim.complete(_keyed("sk-a"), BODY)  # the next period renews it
        return spent.value

    err = run_virtual(scenario())
    assert (err.status, err.kind, err.retry_after) == (429, QUOTA_EXHAUSTED, None)


def test_a_token_quota_refuses_the_attempt_that_would_overspend_it() -> None:
    async def scenario() -> UpstreamError:
        sim = _sim(quota={"tokens": 150})  # one attempt is 100 prompt + 11 output tokens
        await sim.complete(TARGET, BODY)
        with pytest.raises(UpstreamError) as spent:
            await sim.complete(TARGET, BODY)
        return spent.value

    assert run_virtual(scenario()).kind == QUOTA_EXHAUSTED


def test_a_concurrency_plan_refuses_one_more_in_flight_at_once_and_frees_with_the_answer() -> None:
    async def scenario() -> tuple[UpstreamError, float]:
        sim, loop = _sim(concurrency={"limit": 1, "retry_after": 2}), asyncio.get_running_loop()
        start = loop.time()
        first = asyncio.create_task(sim.complete(TARGET, BODY))
        await asyncio.sleep(0)  # one turn of the loop: the first is in flight
        with pytest.raises(UpstreamError) as refused:
            await sim.complete(TARGET, BODY)
        refused_at = loop.time() - start
        await sim.complete(_keyed("sk-other"), BODY)  # another credential's plan
        await first
        await sim.complete(TARGET, BODY)  # its place is free again
        return refused.value, refused_at

    err, at = run_virtual(scenario())
    assert (err.status, err.kind, err.retry_after, at) == (429, "http_429", 2.0, 0.0)


def test_a_cancelled_attempt_gives_its_place_in_the_concurrency_plan_back() -> None:
    async def scenario() -> None:
        sim = _sim(concurrency={"limit": 1}, capacity=1)
        stream = sim.stream(TARGET, BODY)
        assert isinstance(stream, AsyncGenerator)
        await anext(stream)
        await stream.aclose()  # the client went away mid-stream
        await sim.complete(TARGET, BODY)

    run_virtual(scenario())


def test_a_refused_key_is_answered_403_by_its_value_or_its_id() -> None:
    async def scenario() -> list[int | None]:
        sim = _sim(refused_keys=["sk-bad", credential_id("sk-worse")])
        statuses = []
        for key in ("sk-bad", "sk-worse"):
            with pytest.raises(UpstreamError) as refused:
                await sim.complete(_keyed(key), BODY)
            statuses.append(refused.value.status)
        await sim.complete(_keyed("sk-good"), BODY)
        return statuses

    assert run_virtual(scenario()) == [403, 403]


def test_a_403_rate_draws_permission_refusals() -> None:
    async def scenario() -> int | None:
        with pytest.raises(UpstreamError) as refused:
            await _sim(errors={"http_403": 1.0}).complete(TARGET, BODY)
        return refused.value.status

    assert run_virtual(scenario()) == 403


@pytest.mark.parametrize(
    ("provider", "named"),
    [
        ({"quota": {"period_seconds": 60}}, "providers.0.quota"),
        ({"quota": {"requests": 0}}, "providers.0.quota.requests"),
        ({"concurrency": {"limit": 0}}, "providers.0.concurrency.limit"),
        ({"concurrency": {}}, "providers.0.concurrency.limit"),
        ({"refused_keys": [""]}, "providers.0.refused_keys.0"),
        ({"errors": {"http_403": 2}}, "providers.0.errors.http_403"),
        ({"rate_limit": {"tokens": 9, "output_tokens": 9}}, "providers.0.rate_limit"),
    ],
)
def test_a_bad_plan_is_refused_naming_its_field(provider: dict[str, Any], named: str) -> None:
    spec = {"endpoint": "m:p", "ttft": {"median": 1.0, "p90": 1.0}, **provider}
    with pytest.raises(ValidationError) as bad:
        ProvidersFile.model_validate({"providers": [spec]})
    assert named in str(bad.value)
