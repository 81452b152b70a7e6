"""bus.codec: the JSON wire form of every schemas.Message."""

from __future__ import annotations

import json

import pytest

from bus import CodecError, decode, decode_reply, encode
from schemas import (
    EndpointState,
    ErrorReply,
    HealthReport,
    Observation,
    ProbeGrant,
    RouteCandidate,
    RoutePlan,
    RouteRequest,
    StateRequest,
)

SAMPLES = [
    RouteRequest(model="org/qwen2.5:7b", modalities=("text", "image"), pin=None),
    RoutePlan(
        model="m",
        candidates=(RouteCandidate(endpoint="e1", kind="openai", probe=True),),
        pinned=True,
    ),
    Observation(endpoint="e1", model="m", outcome="failure", status=503, ttft_ms=12.5),
    HealthReport(
        endpoints=(EndpointState(endpoint="e", model="m", circuit_state="open", availability=0.5),)
    ),
    StateRequest(),
    ErrorReply(code="route_not_found", message="nope", retry_after=1.5),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_encode_then_decode_returns_an_equal_message(msg: object) -> None:
    assert decode(encode(msg)) == msg  # type: ignore[arg-type]


def test_encode_writes_json_tagged_with_the_struct_name() -> None:
    assert json.loads(encode(StateRequest())) == {"type": "StateRequest"}


@pytest.mark.parametrize(
    "value",
    [RouteCandidate(endpoint="e", kind="k"), {"type": "StateRequest"}, "text"],
    ids=["untagged-struct", "dict", "str"],
)
def test_encode_of_a_value_outside_message_raises_codec_error(value: object) -> None:
    with pytest.raises(CodecError, match="not a bus message"):
        encode(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data",
    [b"", b"{not json", b'{"type":"Nope"}', b'{"type":"ProbeGrant"}', b"[1,2]"],
    ids=["empty", "garbage", "unknown-tag", "missing-field", "not-an-object"],
)
def test_decode_of_bad_data_raises_codec_error_quoting_the_data(data: bytes) -> None:
    with pytest.raises(CodecError, match="cannot decode bus message"):
        decode(data)


def test_decode_reply_of_the_expected_type_returns_it() -> None:
    assert decode_reply(encode(ProbeGrant(granted=True)), ProbeGrant) == ProbeGrant(granted=True)


def test_decode_reply_of_an_error_reply_returns_the_error_reply() -> None:
    err = ErrorReply(code="bus_timeout", message="late", retryable=True)
    assert decode_reply(encode(err), RoutePlan) == err
    assert decode_reply(encode(err), ErrorReply) == err


def test_decode_reply_of_another_message_type_raises_codec_error_naming_the_expected() -> None:
    with pytest.raises(CodecError, match=r"as ProbeGrant \| ErrorReply"):
        decode_reply(encode(StateRequest()), ProbeGrant)


def test_decode_reply_called_again_with_the_same_type_reuses_its_decoder() -> None:
    for granted in (True, False, True):
        assert decode_reply(encode(ProbeGrant(granted=granted)), ProbeGrant) == ProbeGrant(
            granted=granted
        )


def test_decode_reply_as_an_untagged_struct_raises_type_error() -> None:
    with pytest.raises(TypeError, match="cannot decode replies as RouteCandidate"):
        decode_reply(b"{}", RouteCandidate)
