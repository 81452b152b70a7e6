"""What a trace's requests carry besides their size (tools, images, gateway API keys) is
drawn by the synth spec and sent through the real routing: modality filtering, tool-call
answers relayed whole, per-key limits and key affinity."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import msgspec
import pytest

from gateway.replay.answers import (
    CHARS_PER_TOKEN,
    IMAGE_TOKENS,
    asked_tokens_of,
    output_tokens_of,
    prompt_tokens_of,
)
from gateway.replay.requests import request_body
from gateway.replay.runner import replay_config
from gateway.replay.synth import SynthSpec, synthesize
from gateway.replay.trace import TraceKey, TraceRequest, read_keys, read_trace, write_trace
from gateway.replay.vloop import run_virtual
from schemas.limits import LimitSpec
from tests.unit.gateway.replay import providers, two_routes

if TYPE_CHECKING:
    from pathlib import Path

    from schemas.config import GatewayConfig

MIX = {
    "tools": {"share": 0.5, "count": 2, "call_share": 0.5},
    "images": {"share": 0.25, "count": 2},
    "keys": [
        {"name": "batch", "weight": 3, "limits": {"rpm": 60, "budget": "5/day"}},
        {"name": "app", "role": "pro"},
    ],
}


def test_synth_draws_tools_images_and_one_key_per_caller_in_the_specs_shares() -> None:
    spec = SynthSpec.model_validate(
        {"model": "m", "rate": 20, "duration_seconds": 100, "callers": 40, **MIX}
    )
    trace = synthesize(spec, seed=3)
    n = len(trace)
    with_tools = [r for r in trace if r.tools]
    assert all(r.tools == 2 for r in with_tools)
    assert abs(len(with_tools) / n - 0.5) < 0.05
    assert abs(sum(r.tool_call for r in with_tools) / len(with_tools) - 0.5) < 0.07
    assert not any(r.tool_call for r in trace if not r.tools)
    assert abs(sum(r.images == 2 for r in trace) / n - 0.25) < 0.05
    key_of_caller = {(r.caller, r.key) for r in trace}
    assert len(key_of_caller) == len({r.caller for r in trace})  # a caller keeps its key
    keys = Counter(r.key for r in trace)
    assert set(keys) == {"batch", "app"} and keys["batch"] > keys["app"]
    assert spec.trace_keys() == [
        TraceKey(name="batch", limits=LimitSpec(rpm=60, budget_usd=5.0, budget_period="day")),
        TraceKey(name="app", role="pro"),
    ]


def test_synth_draws_max_tokens_caps_in_their_shares_and_the_answer_keeps_its_length() -> None:
    base = {"model": "m", "rate": 20, "duration_seconds": 100}
    plain = synthesize(SynthSpec.model_validate(base), seed=3)
    capped = synthesize(SynthSpec.model_validate({**base, "max_tokens": {300: 0.5}}), seed=3)
    n = len(capped)
    assert [r.max_tokens for r in plain] == [None] * n  # no caps: the trace it always was
    assert abs(sum(r.max_tokens == 300 for r in capped) / n - 0.5) < 0.05
    assert {r.max_tokens for r in capped} == {0, 300}  # the rest set none
    for was, now in zip(plain, capped, strict=True):  # an answer longer than its cap is cut
        assert (now.t, now.prompt_tokens) == (was.t, was.prompt_tokens)
        cut = min(was.output_tokens, 300) if now.max_tokens else was.output_tokens
        assert now.output_tokens == cut
    # On the wire: the cap (or none) as the client's max_tokens; the simulated model reads
    # the answer's length from the prompt, which keeps its size.
    for r in (TraceRequest(id="a", t=0, model="m", prompt_tokens=50, output_tokens=70),
              *(TraceRequest(id="b", t=0, model="m", prompt_tokens=50, output_tokens=70,
                             max_tokens=cap) for cap in (0, 900))):  # fmt: skip
        body = msgspec.json.decode(request_body(r))
        assert body.get("max_tokens") == {None: 70, 0: None, 900: 900}[r.max_tokens]
        assert (prompt_tokens_of(body), output_tokens_of(body)) == (50, 70)
        assert asked_tokens_of(body) == body.get("max_tokens")


def test_a_cap_under_one_or_shares_past_one_are_refused() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        SynthSpec.model_validate({"model": "m", "rate": 1, "duration_seconds": 1,
                                  "max_tokens": {100: 0.7, 200: 0.4}})  # fmt: skip
    with pytest.raises(ValueError, match="max_tokens"):
        SynthSpec.model_validate({"model": "m", "rate": 1, "duration_seconds": 1,
                                  "max_tokens": {0: 0.5}})  # fmt: skip


def test_a_trace_file_carries_its_keys_before_its_requests(tmp_path: Path) -> None:
    spec = SynthSpec.model_validate({"model": "m", "rate": 5, "duration_seconds": 4, **MIX})
    requests = synthesize(spec, seed=1)
    path = tmp_path / "trace.jsonl"
    write_trace(path, requests, spec.trace_keys())
    assert path.read_text().splitlines()[0].startswith('{"kind":"key","name":"batch"')
    assert read_trace(path) == requests
    assert read_keys(path) == spec.trace_keys()


def test_image_requests_go_only_to_the_routes_that_accept_images() -> None:
    base = two_routes()
    model = base.models[0]
    routes = (
        model.route[0],
        model.route[1].model_copy(update={"input_modalities": ("text", "image")}),
    )
    config = base.model_copy(update={"models": (model.model_copy(update={"route": routes}),)})
    trace = [
        TraceRequest(id=f"r{i}", t=i * 0.5, model="m", images=i % 2, stream=i % 3 != 0)
        for i in range(40)
    ]
    run = run_virtual(replay_config("images", config, trace, providers(), seed=1))
    assert all(o.served for o in run.outcomes)
    by_id = {r.id: r for r in trace}
    with_images = {o.endpoint for o in run.outcomes if by_id[o.id].images}
    text_only = {o.endpoint for o in run.outcomes if not by_id[o.id].images}
    assert with_images == {"m:fast"}
    assert text_only == {"m:cheap", "m:fast"}
    # Each image is billed as a provider bills it.
    billed = sum(prompt for prompt, _ in run.billed.values())
    assert billed == sum(r.prompt_tokens + r.images * IMAGE_TOKENS for r in trace)


def test_tool_definitions_reach_the_provider_and_tool_call_answers_are_relayed_whole() -> None:
    trace = [
        TraceRequest(
            id=f"r{i}", t=float(i), model="m", prompt_tokens=50, output_tokens=30,
            tools=3, tool_call=i % 2 == 0, stream=i % 4 < 2,
        )
        for i in range(12)
    ]  # fmt: skip
    run = run_virtual(replay_config("tools", two_routes(), trace, providers(), seed=1))
    assert all(o.served and not o.broken for o in run.outcomes)
    billed = sum(prompt for prompt, _ in run.billed.values())
    # The tool definitions are prompt tokens too: more than the messages alone.
    assert billed > sum(r.prompt_tokens for r in trace) + 12 * 3 * 100 // CHARS_PER_TOKEN


def _keyed(affinity: bool) -> GatewayConfig:
    return two_routes(affinity={"enabled": affinity})


def test_a_keys_rpm_limit_refuses_its_requests_past_it_and_spares_other_keys() -> None:
    keys = [TraceKey(name="tight", limits=LimitSpec(rpm=5)), TraceKey(name="free")]
    trace = [
        TraceRequest(id=f"r{i}", t=i * 0.5, model="m", key="tight" if i % 2 else "free")
        for i in range(40)
    ]  # 20 requests of each key within 20 s
    run = run_virtual(replay_config("limits", _keyed(False), trace, providers(), seed=1, keys=keys))
    by_id = {r.id: r for r in trace}
    tight = Counter(o.status for o in run.outcomes if by_id[o.id].key == "tight")
    free = Counter(o.status for o in run.outcomes if by_id[o.id].key == "free")
    assert tight == {200: 5, 429: 15}
    assert free == {200: 20}


def test_with_affinity_every_request_of_a_key_stays_on_one_route() -> None:
    trace = [
        TraceRequest(id=f"r{i}", t=i * 0.5, model="m", caller=f"c{i}", key=f"k{i % 4}")
        for i in range(80)
    ]
    run = run_virtual(replay_config("affinity", _keyed(True), trace, providers(), seed=1))
    by_id = {r.id: r for r in trace}
    routes: dict[str, set[str]] = {}
    for o in run.outcomes:
        assert o.served
        routes.setdefault(by_id[o.id].key, set()).add(o.endpoint)
    assert all(len(r) == 1 for r in routes.values())  # undeclared keys are made too


def test_a_trace_key_of_an_unknown_role_or_with_a_bad_limit_is_refused_naming_its_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text('{"kind":"key","name":"a"}\n{"kind":"key","name":"b","role":"boss"}\n')
    with pytest.raises(ValueError, match=r"trace.jsonl:2: not a trace key: .*role"):
        read_keys(path)
    path.write_text('{"kind":"key","name":"a","limits":{"rpm":0}}\n')
    with pytest.raises(ValueError, match=r"trace.jsonl:1: the key's limits: 'rpm' must be"):
        read_keys(path)
