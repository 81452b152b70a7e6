"""How the ``azure_openai`` and ``gemini`` adapters classify their platform's answers (through
the real adapters, over HTTP, against the fake upstream speaking each wire): throttling is a
rate limit with the platform's retry-after, quota and billing exhaustion mutes the key, a
content-filter refusal is the caller's; where Azure requests go and with which credential;
and that both carry the attempt's trace headers."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Any

import pytest

from gateway.adapters.azure_openai import AzureOpenAIAdapter, EntraTokens
from gateway.adapters.base import UpstreamTarget
from gateway.adapters.registry import make_adapters, make_http_client
from schemas import QUOTA_EXHAUSTED, RATE_LIMIT_EXCEEDED, ContentFilteredError, UpstreamError
from schemas.config import AzureSettings
from tests.fixtures.upstream import (
    FakeUpstream,
    Reply,
    azure_content_filter_error,
    google_error_body,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from gateway.adapters.base import JSON, Adapter
    from gateway.adapters.upstream_http import UpstreamHTTP

HI: JSON = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}
KEY = "platform-key"


@pytest.fixture
async def http() -> AsyncIterator[UpstreamHTTP]:
    client = make_http_client()
    try:
        yield client
    finally:
        await client.aclose()


def _target(kind: str, up: FakeUpstream, azure: AzureSettings | None = None) -> UpstreamTarget:
    return UpstreamTarget(
        endpoint=f"m:{kind}",
        kind=kind,
        base_url=up.base_url,
        upstream_model="upstream-model",
        api_key=KEY,
        timeout=10.0,
        connect_timeout=5.0,
        azure=azure,
    )


async def _fail(adapter: Adapter, target: UpstreamTarget, stream: bool) -> UpstreamError:
    with pytest.raises(UpstreamError) as err:
        if stream:
            async for _ in adapter.stream(target, {**HI, "stream": True}):
                pass
        else:
            await adapter.complete(target, HI)
    return err.value


# -- azure_openai ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
async def test_azure_content_filter_400_is_the_callers_refusal(
    fake_upstream: FakeUpstream, http: UpstreamHTTP, stream: bool
) -> None:
    fake_upstream.enqueue(Reply(400, body=azure_content_filter_error()))

    err = await _fail(
        make_adapters(http)["azure_openai"], _target("azure_openai", fake_upstream), stream
    )

    assert isinstance(err, ContentFilteredError)
    assert (err.status, err.code.value, err.kind) == (400, "content_filter", "content_filter")
    assert not err.counts_against_endpoint
    assert "content management policy" in err.message


@pytest.mark.parametrize(
    ("headers", "after"),
    [({"retry-after-ms": "1500"}, 1.5), ({"Retry-After": "4", "retry-after-ms": "4000"}, 4.0)],
)
async def test_azure_throttle_is_a_rate_limit_with_its_retry_after(
    fake_upstream: FakeUpstream, http: UpstreamHTTP, headers: dict[str, str], after: float
) -> None:
    fake_upstream.enqueue(Reply(429, headers=headers))

    err = await _fail(
        make_adapters(http)["azure_openai"], _target("azure_openai", fake_upstream), False
    )

    assert (err.status, err.retry_after, err.kind) == (429, after, "http_429")


async def test_azure_throttle_reporting_its_tpm_is_a_refused_pace(
    fake_upstream: FakeUpstream, http: UpstreamHTTP
) -> None:
    # Azure's throttle says its requests or tokens per minute are spent (and mentions a quota
    # increase, which is no spent quota): a pace, which does not halve the learned limit.
    message = "Requests to the ChatCompletions_Create Operation have exceeded token rate limit"
    body = {"error": {"code": "429", "message": f"{message}. Request a quota increase."}}
    headers = {"retry-after": "2", "x-ratelimit-remaining-tokens": "0"}
    fake_upstream.enqueue(Reply(429, headers=headers, body=body))

    err = await _fail(
        make_adapters(http)["azure_openai"], _target("azure_openai", fake_upstream), False
    )

    assert (err.status, err.retry_after, err.kind) == (429, 2.0, RATE_LIMIT_EXCEEDED)


async def test_azure_quota_exhaustion_is_quota_exhausted(
    fake_upstream: FakeUpstream, http: UpstreamHTTP
) -> None:
    body = {"error": {"code": "insufficient_quota", "message": "You exceeded your quota."}}
    fake_upstream.enqueue(Reply(429, body=body))

    err = await _fail(
        make_adapters(http)["azure_openai"], _target("azure_openai", fake_upstream), False
    )

    assert (err.status, err.kind) == (429, QUOTA_EXHAUSTED)


async def test_azure_filtered_completion_is_an_answer_with_content_filter(
    fake_upstream: FakeUpstream, http: UpstreamHTTP
) -> None:
    cut: dict[str, Any] = {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-4o",
        "choices": [
            {
                "index": 0,
                "finish_reason": "content_filter",
                "message": {"role": "assistant", "content": "Once upon"},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    fake_upstream.enqueue(Reply(200, body=cut))

    answer = await make_adapters(http)["azure_openai"].complete(
        _target("azure_openai", fake_upstream), HI
    )

    assert answer["choices"][0]["finish_reason"] == "content_filter"


async def test_azure_request_goes_to_the_deployment_with_the_configured_api_version(
    fake_upstream: FakeUpstream, http: UpstreamHTTP
) -> None:
    settings = AzureSettings(deployment="prod-gpt4o", api_version="2025-01-01-preview")

    await make_adapters(http)["azure_openai"].embed(
        _target("azure_openai", fake_upstream, settings), {"model": "m", "input": "x"}
    )

    (rec,) = fake_upstream.requests
    assert rec.path == "/openai/deployments/prod-gpt4o/embeddings"
    assert rec.query == "api-version=2025-01-01-preview"
    assert rec.headers["api-key"] == KEY and "authorization" not in rec.headers


async def test_azure_entra_token_command_is_sent_as_bearer_and_reused_for_its_ttl(
    fake_upstream: FakeUpstream, http: UpstreamHTTP, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    script = f"open({str(runs)!r}, 'a').write('x'); print('entra-token')"
    settings = AzureSettings(entra_token_command=(sys.executable, "-c", script))
    now = [0.0]
    adapter = AzureOpenAIAdapter(http, EntraTokens(clock=lambda: now[0]))
    target = _target("azure_openai", fake_upstream, settings)

    await adapter.complete(target, HI)
    await adapter.complete(target, HI)
    now[0] = settings.entra_token_ttl_seconds + 1
    await adapter.complete(target, HI)

    assert [r.headers["authorization"] for r in fake_upstream.requests] == [
        "Bearer entra-token"
    ] * 3
    assert all("api-key" not in r.headers for r in fake_upstream.requests)
    assert runs.read_text() == "xx"


async def test_azure_failing_entra_token_command_is_a_credential_error(
    fake_upstream: FakeUpstream, http: UpstreamHTTP
) -> None:
    settings = AzureSettings(entra_token_command=(sys.executable, "-c", "raise SystemExit(3)"))

    err = await _fail(
        AzureOpenAIAdapter(http), _target("azure_openai", fake_upstream, settings), False
    )

    assert err.kind == "credential" and not fake_upstream.requests


# -- gemini ---------------------------------------------------------------------------------

_RETRY = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}


def _quota(quota_id: str) -> dict[str, Any]:
    return {
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [{"quotaMetric": "generate_content_requests", "quotaId": quota_id}],
    }


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
async def test_gemini_resource_exhausted_is_a_rate_limit_with_its_retry_delay(
    fake_upstream: FakeUpstream, http: UpstreamHTTP, stream: bool
) -> None:
    details = [_quota("GenerateRequestsPerMinutePerProjectPerModel"), _RETRY]
    message = "You exceeded your current quota, please check your plan and billing details."
    fake_upstream.enqueue(Reply(429, body=google_error_body(429, message, details)))

    err = await _fail(make_adapters(http)["gemini"], _target("gemini", fake_upstream), stream)

    # A per-minute quota is a pace (its limit is not halved), not a spent key.
    assert (err.status, err.retry_after, err.kind) == (429, 7.0, RATE_LIMIT_EXCEEDED)


async def test_gemini_resource_exhausted_naming_no_quota_may_be_its_capacity(
    fake_upstream: FakeUpstream, http: UpstreamHTTP
) -> None:
    message = "Resource has been exhausted (e.g. check quota)."
    fake_upstream.enqueue(Reply(429, body=google_error_body(429, message, [_RETRY])))

    err = await _fail(make_adapters(http)["gemini"], _target("gemini", fake_upstream), False)

    assert (err.status, err.retry_after, err.kind) == (429, 7.0, "http_429")


async def test_gemini_daily_quota_exhausted_mutes_the_key(
    fake_upstream: FakeUpstream, http: UpstreamHTTP
) -> None:
    details = [_quota("GenerateRequestsPerDayPerProjectPerModel-FreeTier"), _RETRY]
    fake_upstream.enqueue(Reply(429, body=google_error_body(429, "quota", details)))

    err = await _fail(make_adapters(http)["gemini"], _target("gemini", fake_upstream), False)

    assert (err.status, err.kind) == (429, QUOTA_EXHAUSTED)


async def test_gemini_billing_refusal_mutes_the_key(
    fake_upstream: FakeUpstream, http: UpstreamHTTP
) -> None:
    message = "Billing account for project 1 is not found or is closed."
    fake_upstream.enqueue(Reply(403, body=google_error_body(403, message)))

    err = await _fail(make_adapters(http)["gemini"], _target("gemini", fake_upstream), False)

    assert (err.status, err.kind) == (403, QUOTA_EXHAUSTED)


async def test_gemini_invalid_argument_is_the_callers(
    fake_upstream: FakeUpstream, http: UpstreamHTTP
) -> None:
    fake_upstream.enqueue(Reply(400, body=google_error_body(400, "Invalid value at 'contents'")))

    err = await _fail(make_adapters(http)["gemini"], _target("gemini", fake_upstream), False)

    assert err.status == 400 and not err.counts_against_endpoint
    assert err.message == "Invalid value at 'contents'"


async def test_gemini_blocked_prompt_is_an_answer_the_client_reads_as_a_refusal(
    fake_upstream: FakeUpstream, http: UpstreamHTTP
) -> None:
    blocked = {
        "promptFeedback": {"blockReason": "SAFETY"},
        "usageMetadata": {"promptTokenCount": 4},
    }
    fake_upstream.enqueue(Reply(200, body=blocked))

    answer = await make_adapters(http)["gemini"].complete(_target("gemini", fake_upstream), HI)

    assert answer["choices"][0]["finish_reason"] == "content_filter"
    assert answer["usage"]["prompt_tokens"] == 4


@pytest.mark.parametrize("kind", ["azure_openai", "gemini"])
@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
async def test_platform_request_carries_the_attempts_trace_headers(
    fake_upstream: FakeUpstream, http: UpstreamHTTP, kind: str, stream: bool
) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    target = dataclasses.replace(
        _target(kind, fake_upstream), trace_headers={"traceparent": parent}
    )
    adapter = make_adapters(http)[kind]

    if stream:
        _ = [b async for b in adapter.stream(target, {**HI, "stream": True})]
    else:
        await adapter.complete(target, HI)

    assert fake_upstream.requests[0].headers["traceparent"] == parent


async def test_gemini_in_band_stream_error_keeps_its_status_and_quota_kind(
    fake_upstream: FakeUpstream, http: UpstreamHTTP
) -> None:
    spent = google_error_body(429, "quota", [_quota("GenerateRequestsPerDayPerProject")])
    sse = f"data: {json.dumps(spent)}\n\n"
    fake_upstream.enqueue(Reply(200, body=sse, headers={"content-type": "text/event-stream"}))

    err = await _fail(make_adapters(http)["gemini"], _target("gemini", fake_upstream), True)

    assert (err.status, err.kind) == (429, QUOTA_EXHAUSTED)
    assert err.message == "upstream stream error: quota"


@pytest.mark.parametrize(
    ("delay", "wait"),
    [("1e300s", 86_400.0), ("90000s", 86_400.0), ("infs", 5.0), ("nans", 5.0), ("0s", 5.0)],
)
async def test_gemini_retry_delay_is_a_wait_of_at_most_a_day(
    fake_upstream: FakeUpstream, http: UpstreamHTTP, delay: str, wait: float
) -> None:
    # ``1e300s`` kept the route cooling for good (a 301-digit Retry-After), ``infs`` was a
    # 500; none of them a wait to take: the answer's own Retry-After (5 s) stands.
    retry = {**_RETRY, "retryDelay": delay}
    body = google_error_body(429, "slow down", [_quota("PerMinute"), retry])
    fake_upstream.enqueue(Reply(429, body=body, headers={"retry-after": "5"}))

    err = await _fail(make_adapters(http)["gemini"], _target("gemini", fake_upstream), False)

    assert (err.status, err.retry_after) == (429, wait)


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
@pytest.mark.parametrize(
    "error",
    [
        {"code": 429, "message": "m", "details": 5},
        {"code": 429, "message": "m", "details": True},
        {"code": 429, "message": "m", "details": [{**_quota("x"), "violations": 7}]},
    ],
)
async def test_gemini_error_details_of_another_shape_say_nothing_more(
    fake_upstream: FakeUpstream, http: UpstreamHTTP, stream: bool, error: JSON
) -> None:
    # A number where a list goes was a TypeError: a 500.
    body = {"error": error}
    if stream:
        sse = f"data: {json.dumps(body)}\n\n"
        reply = Reply(200, body=sse, headers={"content-type": "text/event-stream"})
    else:
        reply = Reply(429, body=body)
    fake_upstream.enqueue(reply)

    err = await _fail(make_adapters(http)["gemini"], _target("gemini", fake_upstream), stream)

    assert err.status == 429


@pytest.mark.parametrize("code", [True, False, "429", None])
async def test_gemini_in_band_stream_error_with_a_code_not_a_number_is_the_routes_failure(
    fake_upstream: FakeUpstream, http: UpstreamHTTP, code: Any
) -> None:
    # ``"code": true`` made an error of status True: its observation no bus could carry held
    # back every request-log row after it.
    sse = f"data: {json.dumps({'error': {'code': code, 'message': 'weird'}})}\n\n"
    fake_upstream.enqueue(Reply(200, body=sse, headers={"content-type": "text/event-stream"}))

    err = await _fail(make_adapters(http)["gemini"], _target("gemini", fake_upstream), True)

    assert type(err.status) is int and err.status >= 500 and err.counts_against_endpoint
