"""What an attempt costs: the usage an upstream reported (Anthropic's cache reads and writes
included) priced with the route's pricing, or the gateway's estimate, marked; the
admission reservation; the rate headers."""

from __future__ import annotations

import pytest

from gateway.adapters._anthropic_to_canonical import chat_usage
from gateway.auth.gate import ANONYMOUS, BOOTSTRAP_ADMIN, Caller
from gateway.formats.openai_chat import content_chars, delta_chars, parts_chars
from gateway.ingress.admission import caller_subjects, reservation
from gateway.ingress.admission_ticket import rate_headers
from gateway.ingress.settling import usage_of
from schemas.config import ModelConfig
from schemas.limits import AdmitReply, LimitSpec, parse_budget
from schemas.pricing import Pricing, cost_usd

PRICING = Pricing(prompt=3.0, completion=15.0, input_cache_reads=0.3, input_cache_writes=3.75)


def test_anthropic_cache_reads_and_writes_are_priced_at_their_own_rates() -> None:
    body = {
        "usage": chat_usage(
            {
                "input_tokens": 100,
                "cache_read_input_tokens": 1000,
                "cache_creation_input_tokens": 2000,
                "output_tokens": 50,
            }
        )
    }
    usage = usage_of(body)
    assert usage == (3100, 50, 1000, 2000, True, 0)
    cost = cost_usd(
        PRICING,
        prompt_tokens=usage.prompt,
        completion_tokens=usage.completion,
        cache_read_tokens=usage.cached,
        cache_write_tokens=usage.cache_written,
    )
    assert cost == pytest.approx((100 * 3.0 + 1000 * 0.3 + 2000 * 3.75 + 50 * 15.0) / 1e6)


def test_no_usage_is_not_reported_and_the_answer_is_measured_for_the_estimate() -> None:
    body = {
        "choices": [
            {
                "message": {
                    "content": "abcd",
                    "tool_calls": [{"function": {"name": "f", "arguments": '{"a":1}'}}],
                }
            }
        ]
    }
    assert not usage_of(body).reported
    assert content_chars(body) == 4 + 7


def test_a_custom_tool_calls_input_is_measured_as_a_functions_arguments_are() -> None:
    # A custom (freeform) tool call (gpt-5's apply_patch) counted nothing when unreported.
    custom = {"id": "c", "type": "custom", "custom": {"name": "apply_patch", "input": "+hi\n"}}
    body = {"choices": [{"message": {"content": None, "tool_calls": [custom]}}]}
    fragment = {"tool_calls": [{"index": 0, "custom": {"input": "*** End"}}]}

    assert content_chars(body) == 4
    assert delta_chars(fragment) == 7


def test_content_given_as_parts_is_measured_by_its_text() -> None:
    # A list content counted nothing in a whole answer, and its number of parts in a stream.
    parts = [{"type": "text", "text": "abcd"}, {"type": "thinking", "thinking": []}, "junk"]
    body = {"choices": [{"message": {"content": parts}}]}

    assert content_chars(body) == 4
    assert parts_chars(parts) == 4


def test_the_reservation_is_prompt_plus_max_tokens_at_the_dearest_route() -> None:
    model = ModelConfig.model_validate(
        {
            "id": "m",
            "route": [
                {"kind": "echo", "pricing": {"prompt": 1.0, "completion": 2.0}},
                {"kind": "echo", "pricing": {"prompt": 5.0, "completion": 10.0}},
            ],
        }
    )
    tokens, usd = reservation(model, {"max_tokens": 100}, 50, 1024)
    assert tokens == 150
    assert usd == pytest.approx((50 * 5.0 + 100 * 10.0) / 1e6)
    assert reservation(model, {}, 50, 1024)[0] == 50 + 1024
    assert reservation(model, {"max_completion_tokens": 100, "n": 3}, 50, 1024)[0] == 350
    assert reservation(None, None, 50, 1024) == (50, 0.0)  # embeddings, unknown model


def test_limit_subjects_and_headers() -> None:
    caller = Caller(key_hash="h", role="pro", key_id="gk-1", org="acme", user="alice")
    assert caller_subjects(caller) == ("key:gk-1", "org:acme", "user:acme/alice")
    assert caller_subjects(ANONYMOUS) == () and caller_subjects(BOOTSTRAP_ADMIN) == ()
    headers = dict(
        rate_headers(
            AdmitReply(admitted=True, limit_requests=60, remaining_requests=59, reset_requests=0.2)
        )
    )
    assert headers == {
        b"x-ratelimit-limit-requests": b"60",
        b"x-ratelimit-remaining-requests": b"59",
        b"x-ratelimit-reset-requests": b"1s",
    }


def test_budget_text_and_spec_checks() -> None:
    assert parse_budget("10/month") == (10.0, "month")
    assert parse_budget("$2.5/day") == (2.5, "day")
    for bad in ("ten/month", "10/year", "-1/day"):
        with pytest.raises(ValueError, match="budget"):
            parse_budget(bad)
    assert LimitSpec(rpm=0).problems() == ["'rpm' must be a positive integer"]
    assert LimitSpec().problems()  # nothing limited is not a limit


def test_spend_metrics_keep_their_label_cardinality_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gateway.ingress import metrics as metrics_module
    from schemas import Observation, RequestCompleted

    monkeypatch.setattr(metrics_module, "SPEND_CALLERS_MAX", 2)
    m = metrics_module.GatewayMetrics()
    for i in range(5):
        obs = Observation(endpoint="m:a", model="m", outcome="success", cost_usd=1.0)
        m.request(
            RequestCompleted(
                model="m", endpoint="m:a", org=f"o{i}", key_id=f"gk-{i}", cost_usd=1.0
            ),
            [obs],
            None,
        )
    text = m.registry.get_sample_value
    assert (
        text("llmgw_spend_usd_total", {"model": "m", "endpoint": "m:a", "org": "o0", "key": "gk-0"})
        == 1.0
    )
    assert (
        text(
            "llmgw_spend_usd_total",
            {"model": "m", "endpoint": "m:a", "org": "other", "key": "other"},
        )
        == 3.0
    )


def test_unpriced_route_attempts_are_counted_and_a_priced_free_route_is_not() -> None:
    from gateway.ingress.metrics import GatewayMetrics
    from gateway.process.config import parse_config
    from schemas import Observation, RequestCompleted

    config = parse_config(
        "models: [{id: m, route: [{kind: echo}, {kind: openai_compat, base_url: 'http://a'},"
        " {kind: openai_compat, base_url: 'http://b', pricing: {prompt: 0, completion: 0}}]}]"
    )
    _echo, unpriced, free = config.models[0].endpoint_ids()
    assert config.unpriced_endpoints() == (unpriced,)
    m = GatewayMetrics(config)
    value = m.registry.get_sample_value
    labels = {"model": "m", "endpoint": unpriced}
    assert value("llmgw_unpriced_attempts_total", labels) == 0.0  # listed before any use
    for endpoint, billed in ((unpriced, 12), (unpriced, 0), (free, 12)):
        obs = Observation(endpoint=endpoint, model="m", outcome="success", billed_tokens=billed)
        m.request(RequestCompleted(model="m", endpoint=endpoint), [obs], None)
    assert value("llmgw_unpriced_attempts_total", labels) == 1.0  # the attempt that used tokens
    assert value("llmgw_unpriced_attempts_total", {"model": "m", "endpoint": free}) is None
