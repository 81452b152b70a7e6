"""The ``bedrock`` adapter against the fake Bedrock: error classification by exception name,
exception events mid-stream, and signing from botocore's credential chain (the environment,
a named profile of the shared credentials file, a container role's temporary credentials)."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest
from aiohttp import web

from gateway.adapters.base import UpstreamTarget
from gateway.adapters.bedrock import BedrockAdapter
from gateway.adapters.registry import make_adapters, make_http_client
from schemas import UpstreamBadResponseError, UpstreamError
from schemas.bedrock_settings import BedrockSettings
from schemas.text_chunk import Chunk, chunk_json
from tests.fixtures.upstream import Held, Reply
from tests.fixtures.upstream_bedrock import BEDROCK_KEY, BEDROCK_REGION, FakeBedrock, event
from tests.fixtures.upstream_bedrock import exception as exception_frame

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from gateway.adapters.base import Adapter

HI = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def adapter() -> AsyncIterator[Adapter]:
    http = make_http_client()
    try:
        yield make_adapters(http)["bedrock"]
    finally:
        await http.aclose()


def text_of(chunk: Chunk) -> str:
    """The content of a canonical chunk's one choice (empty when it has none)."""
    return str(chunk_json(chunk)["choices"][0]["delta"].get("content") or "")


def _target(up: FakeBedrock, api_key: str | None = BEDROCK_KEY) -> UpstreamTarget:
    return UpstreamTarget(
        endpoint="m:bedrock",
        kind="bedrock",
        base_url=up.base_url,
        upstream_model="amazon.nova-lite-v1:0",
        api_key=api_key,
        timeout=10.0,
        connect_timeout=5.0,
        bedrock=BedrockSettings(region=BEDROCK_REGION),
    )


@pytest.mark.parametrize(
    ("name", "http_status", "status", "kind", "counts", "auth"),
    [
        ("ThrottlingException", 429, 429, "rate_limited", True, False),
        ("ServiceQuotaExceededException", 400, 429, "rate_limited", True, False),
        ("AccessDeniedException", 403, 401, "auth", True, True),
        ("UnrecognizedClientException", 403, 401, "auth", True, True),
        ("ValidationException", 400, 400, "invalid_request", False, False),
        ("ModelTimeoutException", 408, 408, "timeout", True, False),
        ("ServiceUnavailableException", 503, 503, "unavailable", True, False),
        ("InternalServerException", 500, 500, "internal_error", True, False),
    ],
)
async def test_error_answer_is_classified_by_its_exception_name(
    fake_bedrock: FakeBedrock,
    adapter: Adapter,
    name: str,
    http_status: int,
    status: int,
    kind: str,
    counts: bool,
    auth: bool,
) -> None:
    headers = {"x-amzn-ErrorType": f"{name}:http://internal.amazon.com/coral/"}
    fake_bedrock.enqueue(Reply(http_status, body={"message": f"{name} says no"}, headers=headers))

    with pytest.raises(UpstreamError) as err:
        await adapter.complete(_target(fake_bedrock), HI)

    assert (err.value.status, err.value.kind, err.value.message) == (
        status,
        kind,
        f"{name} says no",
    )
    assert err.value.counts_against_endpoint is counts
    assert err.value.is_auth_rejection is auth


async def test_throttling_exception_mid_stream_is_a_rate_limit_after_the_text_before_it(
    fake_bedrock: FakeBedrock, adapter: Adapter
) -> None:
    body = (
        event("messageStart", {"role": "assistant"})
        + event("contentBlockDelta", {"delta": {"text": "Hel"}, "contentBlockIndex": 0})
        + exception_frame("throttlingException", "slow down")
    )
    fake_bedrock.enqueue(Reply(200, body=body))
    got: list[str] = []

    with pytest.raises(UpstreamError) as err:
        async for batch in adapter.stream(_target(fake_bedrock), {**HI, "stream": True}):
            got += [text_of(c) for c in batch]

    assert "".join(got) == "Hel"
    assert (err.value.status, err.value.kind, err.value.message) == (
        429,
        "rate_limited",
        "slow down",
    )


async def test_route_without_a_key_signs_with_botocores_credential_chain(
    fake_bedrock: FakeBedrock,
    adapter: Adapter,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: object,
) -> None:
    key_id, secret = BEDROCK_KEY.split(":")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_CONFIG_FILE", f"{tmp_path}/none")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", f"{tmp_path}/none")

    answer = await adapter.complete(_target(fake_bedrock, api_key=None), HI)

    assert answer["choices"][0]["message"]["content"] == fake_bedrock.text
    assert fake_bedrock.requests[-1].credential == BEDROCK_KEY  # signed by the env's key


def _no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An environment where botocore's chain finds nothing unless a test puts it there."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


async def test_route_with_a_profile_signs_with_that_profiles_credentials(
    fake_bedrock: FakeBedrock,
    adapter: Adapter,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    _no_ambient_credentials(monkeypatch, tmp_path)
    key_id, secret = BEDROCK_KEY.split(":")
    credentials = tmp_path / "credentials"
    credentials.write_text(
        "[default]\naws_access_key_id = AKIDNOTTHISONE\naws_secret_access_key = nope\n"
        f"[bedrock-prod]\naws_access_key_id = {key_id}\naws_secret_access_key = {secret}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    target = dataclasses.replace(
        _target(fake_bedrock, api_key=None),
        bedrock=BedrockSettings(region=BEDROCK_REGION, profile="bedrock-prod"),
    )

    answer = await adapter.complete(target, HI)

    assert answer["choices"][0]["message"]["content"] == fake_bedrock.text
    assert fake_bedrock.requests[-1].credential == BEDROCK_KEY  # the profile's, not default's


async def test_route_in_a_container_signs_with_its_roles_temporary_credentials(
    fake_bedrock: FakeBedrock,
    adapter: Adapter,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # The container credential endpoint (ECS task roles, EKS pod identity) on loopback, which
    # botocore's chain allows: the role's temporary key, with its session token.
    _no_ambient_credentials(monkeypatch, tmp_path)
    key_id, secret = BEDROCK_KEY.split(":")
    expires = datetime.now(UTC) + timedelta(hours=1)
    role = {
        "AccessKeyId": key_id,
        "SecretAccessKey": secret,
        "Token": "role-session-token",
        "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    asked: list[str] = []

    async def credentials(request: web.Request) -> web.Response:
        asked.append(request.headers.get("Authorization", ""))
        return web.json_response(role)

    app = web.Application()
    app.router.add_get("/role", credentials)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"http://127.0.0.1:{port}/role")
        monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", "container-auth")

        answer = await adapter.complete(_target(fake_bedrock, api_key=None), HI)
        await adapter.complete(_target(fake_bedrock, api_key=None), HI)
    finally:
        await runner.cleanup()

    assert answer["choices"][0]["message"]["content"] == fake_bedrock.text
    assert asked == ["container-auth"]  # resolved once, reused until it nears expiry
    for rec in fake_bedrock.requests:
        assert rec.credential == BEDROCK_KEY  # verified with the token signed in
        assert rec.headers["x-amz-security-token"] == "role-session-token"


async def test_route_whose_profile_does_not_exist_fails_as_no_credentials_sending_nothing(
    fake_bedrock: FakeBedrock,
    adapter: Adapter,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: object,
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", f"{tmp_path}/none")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", f"{tmp_path}/none")
    target = dataclasses.replace(
        _target(fake_bedrock, api_key=None),
        bedrock=BedrockSettings(region=BEDROCK_REGION, profile="nope"),
    )

    with pytest.raises(UpstreamError) as err:
        await adapter.complete(target, HI)

    assert (err.value.kind, err.value.status) == ("no_credentials", None)
    assert "ProfileNotFound" in err.value.message
    assert fake_bedrock.requests == []


async def test_image_and_structured_output_requests_pass_the_service_models_validation(
    fake_bedrock: FakeBedrock, adapter: Adapter
) -> None:
    png = "iVBORw0KGgo="
    body = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe it."},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                ],
            }
        ],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "desc", "schema": {"type": "object"}},
        },
    }

    await adapter.complete(_target(fake_bedrock), body)

    sent = fake_bedrock.requests[-1].json
    assert sent["messages"][0]["content"][1]["image"]["source"]["bytes"] == png
    assert sent["outputConfig"]["textFormat"]["structure"]["jsonSchema"]["name"] == "desc"


async def test_a_body_the_service_model_refuses_is_the_callers_validation_error(
    fake_bedrock: FakeBedrock, adapter: Adapter
) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "", "arguments": "{}"}}
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},  # toolUse name min 1
            {"role": "tool", "tool_call_id": "c1", "content": "x"},
        ],
    }

    with pytest.raises(UpstreamError) as err:
        await adapter.complete(_target(fake_bedrock), body)

    assert (err.value.status, err.value.kind) == (400, "invalid_request")
    assert "toolUse.name" in err.value.message, err.value.message
    assert not err.value.counts_against_endpoint


@pytest.mark.parametrize("body", [{"output": ["x"]}, {"output": {"message": "x"}}, []])
async def test_answer_without_an_output_message_is_a_bad_response(
    fake_bedrock: FakeBedrock, adapter: Adapter, body: object
) -> None:
    fake_bedrock.enqueue(Reply(200, body=body))

    with pytest.raises(UpstreamBadResponseError):
        await adapter.complete(_target(fake_bedrock), HI)


async def test_embeddings_on_a_model_of_no_embeddings_family_are_a_400_sparing_the_endpoint(
    fake_bedrock: FakeBedrock, adapter: Adapter
) -> None:
    with pytest.raises(UpstreamError) as err:
        await adapter.embed(_target(fake_bedrock), {"model": "m", "input": "x"})

    assert err.value.status == 400 and not err.value.counts_against_endpoint
    assert fake_bedrock.requests == []


# -- embeddings: InvokeModel ------------------------------------------------------------------

TITAN, COHERE = "amazon.titan-embed-text-v2:0", "cohere.embed-multilingual-v3"


def _embed_target(up: FakeBedrock, model: str) -> UpstreamTarget:
    return dataclasses.replace(_target(up), upstream_model=model)


async def test_titan_embeds_one_input_per_signed_invoke_with_the_dimensions(
    fake_bedrock: FakeBedrock, adapter: Adapter
) -> None:
    body = {"model": "m", "input": ["one", "two", "three"], "dimensions": 256}

    answer = await adapter.embed(_embed_target(fake_bedrock, TITAN), body)

    assert {(r.model, r.path.rsplit("/", 1)[1]) for r in fake_bedrock.requests} == {
        (TITAN, "invoke")
    }
    assert sorted(r.json["inputText"] for r in fake_bedrock.requests) == ["one", "three", "two"]
    assert all(r.json["dimensions"] == 256 for r in fake_bedrock.requests)
    assert all(r.credential == BEDROCK_KEY for r in fake_bedrock.requests)  # signature checked
    vectors = [item["embedding"] for item in answer["data"]]
    assert [len(v) for v in vectors] == [256] * 3 and len({tuple(v) for v in vectors}) == 3
    per_call = fake_bedrock.prompt_tokens
    assert answer["usage"] == {"prompt_tokens": 3 * per_call, "total_tokens": 3 * per_call}
    assert answer["model"] == TITAN


async def test_titan_batch_keeps_at_most_embed_parallel_invokes_in_flight(
    fake_bedrock: FakeBedrock,
) -> None:
    http = make_http_client()
    try:
        adapter = BedrockAdapter(http, embed_parallel=2)
        fake_bedrock.set_default(Held())
        body = {"model": "m", "input": ["a", "b", "c", "d", "e"]}
        task = asyncio.create_task(adapter.embed(_embed_target(fake_bedrock, TITAN), body))
        await fake_bedrock.wait_for_requests(2)
        fake_bedrock.release_held()
        answer = await task
    finally:
        await http.aclose()

    assert [item["index"] for item in answer["data"]] == [0, 1, 2, 3, 4]
    assert len(fake_bedrock.requests) == 5 and fake_bedrock.max_in_flight == 2


async def test_cohere_embeds_the_batch_in_one_invoke_counting_the_header_tokens(
    fake_bedrock: FakeBedrock, adapter: Adapter
) -> None:
    body = {"model": "m", "input": ["a", "b"], "encoding_format": "base64"}

    answer = await adapter.embed(_embed_target(fake_bedrock, COHERE), body)

    (rec,) = fake_bedrock.requests
    assert rec.json == {"texts": ["a", "b"], "input_type": "search_document"}
    assert rec.headers["content-type"] == rec.headers["accept"] == "application/json"
    assert all(isinstance(item["embedding"], str) for item in answer["data"])  # base64
    assert answer["usage"]["prompt_tokens"] == fake_bedrock.prompt_tokens


async def test_cohere_with_dimensions_is_a_400_and_sends_nothing(
    fake_bedrock: FakeBedrock, adapter: Adapter
) -> None:
    body = {"model": "m", "input": "a", "dimensions": 256}

    with pytest.raises(UpstreamError) as err:
        await adapter.embed(_embed_target(fake_bedrock, COHERE), body)

    assert err.value.status == 400 and not err.value.counts_against_endpoint
    assert fake_bedrock.requests == []


async def test_throttled_invoke_is_a_rate_limit_for_the_whole_batch(
    fake_bedrock: FakeBedrock, adapter: Adapter
) -> None:
    fake_bedrock.enqueue(Reply(429, headers={"Retry-After": "3"}))

    with pytest.raises(UpstreamError) as err:
        await adapter.embed(_embed_target(fake_bedrock, TITAN), {"model": "m", "input": ["a", "b"]})

    assert (err.value.status, err.value.kind, err.value.retry_after) == (429, "rate_limited", 3.0)


# -- answers and events that break the service model's shapes: the endpoint's bad response --


@pytest.mark.parametrize(
    "content", ["hi", [{"text": 5}], [{"toolUse": "f"}]], ids=["content", "text", "toolUse"]
)
async def test_a_converse_answer_that_breaks_its_shapes_is_the_endpoints_bad_response(
    fake_bedrock: FakeBedrock, adapter: Adapter, content: object
) -> None:
    body = {"output": {"message": {"role": "assistant", "content": content}}}
    fake_bedrock.enqueue(Reply(200, body={**body, "stopReason": "end_turn"}))

    with pytest.raises(UpstreamBadResponseError) as err:
        await adapter.complete(_target(fake_bedrock), HI)

    assert (err.value.endpoint, err.value.kind) == ("m:bedrock", "bad_response")


async def test_a_stream_event_that_breaks_its_shapes_ends_the_stream_after_the_text_before_it(
    fake_bedrock: FakeBedrock, adapter: Adapter
) -> None:
    body = event("contentBlockDelta", {"delta": {"text": "Hel"}, "contentBlockIndex": 0}) + event(
        "contentBlockDelta", {"delta": "lo", "contentBlockIndex": 0}
    )
    fake_bedrock.enqueue(Reply(200, body=body))
    got: list[str] = []

    with pytest.raises(UpstreamBadResponseError) as err:
        async for batch in adapter.stream(_target(fake_bedrock), {**HI, "stream": True}):
            got += [text_of(c) for c in batch]

    assert "".join(got) == "Hel" and err.value.endpoint == "m:bedrock"


@pytest.mark.parametrize("vector", [["a"], [True, 0.5], [None]], ids=["str", "bool", "null"])
@pytest.mark.parametrize("encoding", ["float", "base64"])
async def test_an_embedding_that_is_not_numbers_is_a_bad_response(
    fake_bedrock: FakeBedrock, adapter: Adapter, vector: list[object], encoding: str
) -> None:
    # Packing "a" as float32 raised TypeError (a 500); as floats it was relayed as given.
    fake_bedrock.enqueue(Reply(200, body={"embedding": vector, "inputTextTokenCount": 1}))
    body = {"model": "m", "input": "a", "encoding_format": encoding}

    with pytest.raises(UpstreamBadResponseError):
        await adapter.embed(_embed_target(fake_bedrock, TITAN), body)


@pytest.mark.parametrize("count", ["3", -3, True, 2.5])
async def test_an_embedding_token_count_that_is_not_sane_leaves_the_usage_unknown(
    fake_bedrock: FakeBedrock, adapter: Adapter, count: object
) -> None:
    fake_bedrock.enqueue(Reply(200, body={"embedding": [0.5, 1], "inputTextTokenCount": count}))
    fake_bedrock.enqueue(Reply(200, body={"embedding": [0.25, 2], "inputTextTokenCount": 4}))
    body = {"model": "m", "input": ["a", "b"]}

    answer = await adapter.embed(_embed_target(fake_bedrock, TITAN), body)

    assert answer["usage"] is None
    assert sorted(item["embedding"][0] for item in answer["data"]) == [0.25, 0.5]
