"""``carries_token``: which canonical chunks carry part of the answer (what decides a hedged
stream's race and its time to first token); what a 429 says: how long to wait (its headers)
and whether it is back-pressure or an exhausted quota; which choices the seam lets through."""

from __future__ import annotations

import dataclasses
import datetime
import email.utils
import time
from typing import TYPE_CHECKING, Any

import pytest

from gateway.adapters.base import (
    UpstreamTarget,
    answer_problem,
    carries_token,
    choices_asked,
    chunk_problem,
    duration_seconds,
    error_from_status,
    rate_limit_spent_seconds,
    rate_report,
    sanitise_usage,
)
from schemas import QUOTA_EXHAUSTED, RATE_LIMIT_EXCEEDED, Observation, is_backpressure
from schemas.routing import RateReport

if TYPE_CHECKING:
    from gateway.adapters.base import JSON


def chunk(delta: dict[str, Any] | None, **extra: Any) -> JSON:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": None}]
    return {"object": "chat.completion.chunk", "choices": choices, **extra}


CALL = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}


@pytest.mark.parametrize(
    ("c", "expected"),
    [
        (chunk({"content": "Hi"}), True),
        (chunk({"role": "assistant", "content": "Hi"}), True),
        (chunk({"role": "assistant", "content": None, "tool_calls": [CALL]}), True),
        (chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}), True),
        (chunk({"function_call": {"name": "f", "arguments": ""}}), True),
        (chunk({"refusal": "I can't help with that."}), True),
        (chunk({"reasoning_content": "Let me think"}), True),
        (chunk({"reasoning": "Let me think"}), True),
        (chunk({"audio": {"id": "a1", "transcript": "Hi"}}), True),
        (chunk({"content": [{"type": "text", "text": "Hi"}]}), True),  # parts (Mistral's)
        (chunk({"content": [{"type": "thinking", "thinking": "Let me think"}]}), True),
        (chunk({"role": "assistant", "content": []}), False),
        (chunk({"role": "assistant"}), False),
        (chunk({"role": "assistant", "content": "", "refusal": None}), False),
        (chunk({"role": "assistant", "content": None, "tool_calls": []}), False),
        (chunk({}), False),  # a finish chunk's delta
        (chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 5}), False),
        ({"object": "chat.completion.chunk", "choices": [{"index": 0}]}, False),
        ({"choices": ["not a choice"]}, False),
    ],
)
def test_carries_token_only_for_answer_text_tool_calls_refusals_or_reasoning(
    c: JSON, expected: bool
) -> None:
    assert carries_token(c) is expected


# -- a 429's reset and its kind ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("0.5s", 0.5),
        ("2", 2.0),
        ("soon", None),
        ("1s2", None),
        ("", None),
        ("nan", None),
        ("inf", None),
        ("9" * 400 + "s", None),  # a Go-style form adding up to infinity
    ],
)
def test_duration_seconds_reads_openais_reset_forms(text: str, seconds: float | None) -> None:
    assert duration_seconds(text) == (pytest.approx(seconds) if seconds is not None else None)


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "7", "x-ratelimit-reset-requests": "1s"}, 7.0),
        ({"retry-after-ms": "250"}, 0.25),
        (
            {
                "x-ratelimit-reset-requests": "2s",
                "x-ratelimit-reset-tokens": "6m0s",
                "x-ratelimit-remaining-tokens": "0",
            },
            360.0,
        ),
        ({"x-ratelimit-reset-requests": "2s", "x-ratelimit-reset-tokens": "6m0s"}, 2.0),
        ({}, None),
        # No wait, or a malformed one, is no hint (the key's own backoff applies) ...
        ({"retry-after": "0"}, None),
        ({"retry-after": "-5"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "inf"}, None),
        ({"retry-after": "1e400"}, None),
        ({"retry-after-ms": "0"}, None),
        ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "0s"}, None),
        # ... and the next header that says something is read instead.
        ({"retry-after": "0", "retry-after-ms": "250"}, 0.25),
        ({"retry-after": "nan", "x-ratelimit-reset-requests": "2s"}, 2.0),
        # ... and no wait lasts longer than a day.
        ({"retry-after": "1e300"}, 86400.0),
        # An HTTP date already past, or not a date, is no wait either.
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),
        ({"retry-after": "Sunday, 32-Nov-94 08:49:37 GMT"}, None),
    ],
)
def test_a_429s_wait_is_retry_after_else_the_reset_of_the_limit_that_ran_out(
    headers: dict[str, str], seconds: float | None
) -> None:
    err = error_from_status("m:a", 429, headers, b"{}")

    assert err.retry_after == (pytest.approx(seconds) if seconds is not None else None)
    # What is left of a rate limit, reported, says the 429 refused a pace.
    metered = any(h.startswith("x-ratelimit-remaining-") for h in headers)
    assert err.kind == (RATE_LIMIT_EXCEEDED if metered else "http_429")


@pytest.mark.parametrize(
    ("headers", "body", "kind"),
    [
        # OpenAI's, Azure's and most compatible providers' rate limits report their state ...
        ({"x-ratelimit-remaining-requests": "0", "retry-after": "1"}, b"{}", RATE_LIMIT_EXCEEDED),
        ({"x-ratelimit-remaining-tokens": "12"}, b"{}", RATE_LIMIT_EXCEEDED),
        # ... as Anthropic's do in its own names ...
        ({"anthropic-ratelimit-requests-remaining": "0"}, b"{}", RATE_LIMIT_EXCEEDED),
        ({"anthropic-ratelimit-output-tokens-remaining": "0"}, b"{}", RATE_LIMIT_EXCEEDED),
        # ... a 429 that says nothing of a rate may be a concurrency plan's ...
        (
            {"retry-after": "1"},
            b'{"error": {"message": "Too many concurrent requests"}}',
            "http_429",
        ),
        ({"x-ratelimit-limit-requests": "10"}, b"{}", "http_429"),
        # ... and a spent quota is no pace, whatever the headers say.
        (
            {"x-ratelimit-remaining-requests": "5"},
            b'{"error": {"code": "insufficient_quota"}}',
            QUOTA_EXHAUSTED,
        ),
    ],
)
def test_a_429_whose_headers_report_a_rate_limit_is_a_refused_pace(
    headers: dict[str, str], body: bytes, kind: str
) -> None:
    assert error_from_status("m:a", 429, headers, body).kind == kind


@pytest.mark.parametrize("form", ["IMF-fixdate", "rfc850", "asctime"])
def test_a_429s_retry_after_as_an_http_date_is_the_wait_until_then(form: str) -> None:
    # It was no hint: RFC 9110 allows a date as well as seconds.
    when = time.time() + 120
    stamp = email.utils.formatdate(when, usegmt=True)
    if form == "rfc850":
        stamp = time.strftime("%A, %d-%b-%y %H:%M:%S GMT", time.gmtime(when))
    elif form == "asctime":
        stamp = time.asctime(time.gmtime(when))

    err = error_from_status("m:a", 429, {"retry-after": stamp}, b"{}")

    assert err.retry_after is not None and 115 < err.retry_after <= 120


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1.5s"}, 1.5),
        ({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "6m0s"}, 360.0),
        ({"x-ratelimit-remaining-requests": "0"}, 1.0),  # no reset said: a second
        ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1e300"}, 86400.0),
        ({"x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "1s"}, None),
        ({}, None),
    ],
)
def test_a_successful_answers_spent_limit_lasts_until_its_reset(
    headers: dict[str, str], seconds: float | None
) -> None:
    assert rate_limit_spent_seconds(headers) == seconds


def _state(limit: str, left: str, reset: str) -> dict[str, str]:
    return {
        "x-ratelimit-limit-requests": limit,
        "x-ratelimit-remaining-requests": left,
        "x-ratelimit-reset-requests": reset,
    }


@pytest.mark.parametrize(
    ("headers", "report"),
    [
        (_state("500", "499", "120ms"), RateReport(limit=500, remaining=499, reset_seconds=0.12)),
        (_state("60", "0", "6m0s"), RateReport(limit=60, remaining=0, reset_seconds=360.0)),
        (_state("60", "0", "1e300"), RateReport(limit=60, remaining=0, reset_seconds=86400.0)),
        ({"x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "1s"}, None),
        (_state("60", "61", "1s"), None),  # more left than the limit: not a limit's state
        (_state("0", "0", "1s"), None),
        (_state("1" + "0" * 400, "5", "1s"), None),  # no limit's size: a float cannot hold it
        (_state(str(10**12), "5", "1s"), RateReport(limit=10**12, remaining=5, reset_seconds=1.0)),
        (_state("60", "x", "1s"), None),
        (_state("60", "3", "soon"), None),
        ({}, None),
    ],
)
def test_an_answer_reports_its_request_limits_state_only_when_it_says_all_of_it(
    headers: dict[str, str], report: RateReport | None
) -> None:
    assert rate_report(headers) == report


def test_anthropics_request_limit_resets_at_a_time_not_after_a_duration() -> None:
    def state(reset: str) -> dict[str, str]:
        return {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "49",
            "anthropic-ratelimit-requests-reset": reset,
        }

    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=30)
    report = rate_report(state(soon.isoformat().replace("+00:00", "Z")))
    assert report is not None and (report.limit, report.remaining) == (50, 49)
    assert 28.0 < report.reset_seconds <= 30.0
    assert rate_report(state("2020-01-01T00:00:00Z")) == RateReport(
        limit=50, remaining=49, reset_seconds=0.0
    )  # past: all of it is back
    assert rate_report(state("2030-01-01T00:00:00")) is None  # no zone: not RFC 3339
    assert rate_report(state("in a minute")) is None
    # Read against the answer's Date (the provider's clock), not this host's: 100 s behind.
    sent = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=100)
    behind = state((sent + datetime.timedelta(seconds=30)).isoformat())
    behind["date"] = email.utils.format_datetime(sent, usegmt=True)
    report = rate_report(behind)
    assert report is not None and 29.0 < report.reset_seconds <= 31.0


def test_a_paced_request_limit_leaves_only_the_token_limit_to_spend_a_route() -> None:
    spent = {**_state("60", "0", "30s"), "x-ratelimit-remaining-tokens": "5"}
    paced = rate_report(spent)
    assert paced is not None and paced.tokens is None  # no token limit and reset: not paced
    assert rate_limit_spent_seconds(spent) == 30.0
    assert rate_limit_spent_seconds(spent, paced=paced) is None
    spent |= {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "2s"}
    assert rate_limit_spent_seconds(spent, paced=paced) == 2.0


def test_a_paced_token_limit_spends_no_route_until_all_of_it_is_back() -> None:
    spent = {
        **_state("60", "0", "30s"),
        "x-ratelimit-limit-tokens": "90000",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "2s",
    }
    paced = rate_report(spent)

    assert paced is not None and paced.tokens is not None
    assert rate_limit_spent_seconds(spent) == 30.0
    assert rate_limit_spent_seconds(spent, paced=paced) is None


def test_the_token_limit_rides_on_the_request_limits_report() -> None:
    openai = {
        **_state("500", "499", "120ms"),
        "x-ratelimit-limit-tokens": "30000",
        "x-ratelimit-remaining-tokens": "29000",
        "x-ratelimit-reset-tokens": "2s",
    }
    assert rate_report(openai) == RateReport(
        limit=500,
        remaining=499,
        reset_seconds=0.12,
        tokens=RateReport(limit=30000, remaining=29000, reset_seconds=2.0),
    )
    # A token limit not whole (no reset, a remaining above it) is left out, not the report.
    for broken in ({"x-ratelimit-reset-tokens": "soon"}, {"x-ratelimit-remaining-tokens": "40000"}):
        report = rate_report(openai | broken)
        assert report is not None and report.limit == 500 and report.tokens is None
    # Tokens alone are no report: the request limit is what a pace is kept on.
    tokens_only = {k: v for k, v in openai.items() if "tokens" in k}
    assert rate_report(tokens_only) is None
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=6)
    anthropic = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": soon.isoformat(),
        "anthropic-ratelimit-tokens-limit": "80000",
        "anthropic-ratelimit-tokens-remaining": "60000",
        "anthropic-ratelimit-tokens-reset": soon.isoformat(),
    }
    report = rate_report(anthropic)
    assert report is not None and report.tokens is not None and report.output_tokens is None
    assert (report.tokens.limit, report.tokens.remaining) == (80000, 60000)
    assert 4.0 < report.tokens.reset_seconds <= 6.0
    # Its input and output limits apart, when all six are there (the combined limit is their
    # sum: a request may fit it and not the output alone).
    apart = {
        "anthropic-ratelimit-input-tokens-limit": "64000",
        "anthropic-ratelimit-input-tokens-remaining": "58000",
        "anthropic-ratelimit-input-tokens-reset": soon.isoformat(),
        "anthropic-ratelimit-output-tokens-limit": "16000",
        "anthropic-ratelimit-output-tokens-remaining": "2000",
        "anthropic-ratelimit-output-tokens-reset": soon.isoformat(),
    }
    report = rate_report(anthropic | apart)
    assert report is not None and report.tokens is not None and report.output_tokens is not None
    assert (report.tokens.limit, report.tokens.remaining) == (64000, 58000)
    assert (report.output_tokens.limit, report.output_tokens.remaining) == (16000, 2000)
    # One of the two not whole: the combined limit, as without them.
    half = {k: v for k, v in apart.items() if k != "anthropic-ratelimit-input-tokens-reset"}
    report = rate_report(anthropic | half)
    assert report is not None and report.tokens is not None and report.output_tokens is None
    assert report.tokens.limit == 80000


def test_reset_headers_do_not_make_a_retry_after_for_other_statuses() -> None:
    err = error_from_status("m:a", 503, {"x-ratelimit-reset-requests": "2s"}, b"{}")

    assert err.retry_after is None


def test_a_429_that_says_the_quota_is_exhausted_is_no_backpressure() -> None:
    body = b'{"error": {"message": "You exceeded your quota", "code": "insufficient_quota"}}'
    err = error_from_status("m:a", 429, {}, body)

    assert err.kind == QUOTA_EXHAUSTED
    assert not is_backpressure(
        Observation(endpoint="m:a", model="m", outcome="failure", status=429, error_kind=err.kind)
    )
    assert is_backpressure(
        Observation(endpoint="m:a", model="m", outcome="failure", status=429, error_kind="http_429")
    )


def test_a_traced_target_keeps_every_field_and_carries_the_headers() -> None:
    fields = dataclasses.fields(UpstreamTarget)
    # every field a value unlike its default, so a field the copy forgets shows
    values: dict[str, Any] = {f.name: object() for f in fields}
    target = UpstreamTarget(**values)
    headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}

    traced = target.traced(headers)

    assert traced == dataclasses.replace(target, trace_headers=headers)
    assert all(
        getattr(traced, f.name) is values[f.name] for f in fields if f.name != "trace_headers"
    )
    assert traced.trace_headers is headers


@pytest.mark.parametrize(
    ("usage", "kept"),
    [
        ({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}, True),
        ({"prompt_tokens": 3.0, "completion_tokens": None, "queue_time": 0.5}, True),
        ({"prompt_tokens": 10**30}, False),
        ({"prompt_tokens": "a", "completion_tokens": -5, "total_tokens": None}, False),
        ({"prompt_tokens": True}, False),
        ({"prompt_tokens": 1.5}, False),
        ({"prompt_tokens": 1, "prompt_tokens_details": {"cached_tokens": -1}}, False),
        ({"prompt_tokens": 1, "completion_tokens_details": "x"}, False),
        ("x", False),
    ],
)
def test_sanitise_usage_keeps_sane_counts_makes_the_rest_unknown(usage: Any, kept: bool) -> None:
    body: JSON = {"usage": usage}
    sanitise_usage(body)
    if kept:
        counts = [v for k, v in body["usage"].items() if k.endswith("tokens") and v is not None]
        assert counts and all(type(v) is int for v in counts), body
    else:
        assert body["usage"] is None


def _choice(index: Any = 0, **part: Any) -> JSON:
    return {"index": index, "finish_reason": None, **part}


@pytest.mark.parametrize(
    ("choice", "n", "bad"),
    [
        (_choice(0, delta={"content": "a"}), 1, False),
        (_choice(1, delta={"content": "a"}), 2, False),
        ({"delta": {"content": "a"}}, 1, False),  # no index: choice 0, as the renderers read it
        (_choice(0, delta=None), 1, False),  # Azure's asynchronous content filter
        ({"index": 0, "content_filter_offsets": {"check_offset": 4}}, 1, False),
        (_choice("zero", delta={"content": "a"}), 1, True),
        (_choice(-1, delta={"content": "a"}), 1, True),
        (_choice(10**12, delta={"content": "a"}), 1, True),
        (_choice(1, delta={"content": "a"}), 1, True),
        (_choice(True, delta={"content": "a"}), 1, True),
    ],
)
def test_a_chunk_choice_whose_index_was_not_asked_for_is_a_problem(
    choice: JSON, n: int, bad: bool
) -> None:
    # The Responses and Messages renderers show choice 0 only: any other was dropped from a
    # "completed" answer, while chat clients got it.
    problem = chunk_problem({"choices": [choice]}, n)
    assert (problem is not None) == bad, problem


MESSAGE = {"role": "assistant", "content": "a"}


@pytest.mark.parametrize(
    ("answer", "n", "bad"),
    [
        ({"choices": [_choice(0, message=MESSAGE)]}, 1, False),
        ({"choices": [_choice(0, message=MESSAGE), _choice(1, message=MESSAGE)]}, 2, False),
        ({"choices": []}, 1, True),
        ({"choices": None}, 1, True),
        ({"choices": [_choice(0, message=None)]}, 1, True),
        ({"choices": [{"index": 0, "finish_reason": "stop"}]}, 1, True),
        ({"choices": [_choice("zero", message=MESSAGE)]}, 1, True),
        ({"choices": [_choice(1, message=MESSAGE)]}, 1, True),
    ],
)
def test_a_whole_answer_without_a_choice_to_show_is_a_problem(
    answer: JSON, n: int, bad: bool
) -> None:
    # Chat clients were relayed a 200 with nothing in it; Responses and Messages got a 502.
    problem = answer_problem(answer, n)
    assert (problem is not None) == bad, problem


@pytest.mark.parametrize(("n", "asked"), [(None, 1), (3, 3), (0, 1), ("2", 1), (True, 1)])
def test_choices_asked_is_the_requests_n_else_one(n: Any, asked: int) -> None:
    assert choices_asked({} if n is None else {"n": n}) == asked


TEXT = {"type": "text", "text": "Hi"}
THINKING = {"type": "thinking", "thinking": [TEXT, {"type": "reference", "reference_ids": [1]}]}


@pytest.mark.parametrize(
    ("parts", "bad"),
    [
        ([TEXT, {"type": "refusal", "refusal": "No."}, {"type": "text", "text": None}], False),
        ([THINKING, {"type": "thinking", "thinking": "Hmm"}, {"type": "thinking"}], False),
        ([{"type": "image_url", "image_url": 5}, {"text": 5}, {"type": 7}], False),  # unread
        ([], False),
        (["Hi"], True),
        ([TEXT, None], True),
        ([{"type": "text", "text": 5}], True),
        ([{"type": "refusal", "refusal": ["No."]}], True),
        ([{"type": "thinking", "thinking": 5}], True),
        ([{"type": "thinking", "thinking": ["Hmm"]}], True),
        ([{"type": "thinking", "thinking": [{"type": "text", "text": {}}]}], True),
    ],
)
def test_a_content_of_parts_must_hold_objects_whose_known_texts_are_strings(
    parts: list[Any], bad: bool
) -> None:
    # A list of anything was let through: relayed to chat clients, a TypeError in the
    # Responses and Messages renderers.
    for problem in (
        chunk_problem(chunk({"content": parts})),
        answer_problem({"choices": [_choice(0, message={"content": parts})]}),
    ):
        assert (problem is not None) == bad, problem


SIGNED = {"type": "thinking", "thinking": "Hmm", "signature": "sig"}


@pytest.mark.parametrize(
    ("blocks", "bad"),
    [
        ([SIGNED, {"type": "redacted_thinking", "data": "x"}, {"type": "thinking"}], False),
        ([], False),
        ({"type": "thinking"}, True),
        ([SIGNED, "sig"], True),
        ([{"type": "thinking", "thinking": "Hmm", "signature": 5}], True),
        ([{"type": "redacted_thinking", "data": ["x"]}], True),
        ([{"type": 5}], True),
    ],
)
def test_thinking_blocks_must_be_objects_whose_texts_are_strings(blocks: Any, bad: bool) -> None:
    # Unchecked, a signature of 5 reached the Messages renderer and the client's SDK.
    for problem in (
        chunk_problem(chunk({"thinking_blocks": blocks})),
        answer_problem({"choices": [_choice(0, message={"thinking_blocks": blocks})]}),
    ):
        assert (problem is not None) == bad, problem


def test_a_custom_tool_call_is_checked_as_a_function_call_is() -> None:
    # Chat's custom (freeform) tool call, gpt-5's: {"id", "type": "custom", "custom": {...}}.
    good = {"id": "call_1", "type": "custom", "custom": {"name": "apply_patch", "input": "x"}}
    fragment = {"index": 0, "custom": {"input": "*** Begin"}}
    bad = [
        {"id": "call_1", "type": "custom", "custom": "apply_patch"},
        {"id": "call_1", "type": "custom", "custom": {"name": "apply_patch", "input": {"a": 1}}},
        {"index": 0, "custom": {"name": 5}},
    ]

    def answer(call: Any) -> JSON:
        return {"choices": [_choice(0, message={"role": "assistant", "tool_calls": [call]})]}

    def chunk(call: Any) -> JSON:
        return {"choices": [_choice(0, delta={"tool_calls": [call]})]}

    assert answer_problem(answer(good)) is None
    assert chunk_problem(chunk({**good, "index": 0})) is None
    assert chunk_problem(chunk(fragment)) is None
    assert [answer_problem(answer(call)) for call in bad[:2]] == [
        "a tool call's 'custom' is not an object",
        "a tool call's custom 'input' is not a string",
    ]
    assert chunk_problem(chunk(bad[2])) == "a tool call's custom 'name' is not a string"
