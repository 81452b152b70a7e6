"""A simulated provider's rate limit (a ``providers.yaml`` entry's ``rate_limit``): requests
and tokens in a sliding window (``kind: window``) or taken from a bucket that refills evenly
(``kind: bucket``, as OpenAI and Anthropic meter), and what its answers report of it.

A request takes its prompt and its ``max_tokens`` (what the provider reserves while the
answer runs) and gets back what the answer did not use when it ends. A bucket with
``output_tokens`` meters output apart, as Anthropic does: ``tokens`` is then the input limit
(the prompt) and ``output_tokens`` the output one (the reserved ``max_tokens``); its answers
report the two apart (``report_apart``) or only together, their sum.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from gateway.adapters.base import error_from_status
from schemas.routing import RateReport

if TYPE_CHECKING:
    from gateway.replay.providers import RateLimit

_encode = msgspec.json.Encoder().encode


@dataclass(slots=True)
class _Bucket:
    """A ``kind: bucket`` rate limit's requests, tokens and output tokens left at ``at``."""

    requests: float
    tokens: float
    output: float
    at: float

    def refill(self, limit: RateLimit, now: float) -> None:
        """What refilled since ``at``, up to the limits."""
        share = (now - self.at) / limit.per_seconds
        if limit.requests is not None:
            self.requests = min(float(limit.requests), self.requests + share * limit.requests)
        if limit.tokens is not None:
            self.tokens = min(float(limit.tokens), self.tokens + share * limit.tokens)
        if limit.output_tokens is not None:
            self.output = min(float(limit.output_tokens), self.output + share * limit.output_tokens)
        self.at = now


class RateMeter:
    """Owns one simulated route's rate limit state (its window, or its bucket from its first
    request). Raises the UpstreamError of a 429 beyond the limit."""

    def __init__(self, limit: RateLimit, endpoint: str) -> None:
        self._limit = limit
        self._endpoint = endpoint
        self._window: deque[tuple[float, int]] = deque()  # (started, tokens)
        self._bucket: _Bucket | None = None

    def take(self, now: float, prompt: int, reserved: int) -> RateReport | None:
        """Count an attempt of ``prompt`` tokens reserving ``reserved`` output tokens, or
        raise the 429 a provider answers beyond the limit; the state of a request limit as
        its answer's headers say it (as OpenAI's do, on every answer: what was left once
        this one was taken, and when all of it is back, the window's length after the
        request just taken)."""
        if self._limit.kind == "bucket":
            return self._from_bucket(now, prompt, reserved)
        return self._in_window(now, prompt + reserved)

    def give_back(self, taken_at: float, tokens: int, now: float) -> None:
        """``tokens`` of output that an attempt admitted at ``taken_at`` reserved come back
        (its answer ended shorter than its ``max_tokens``)."""
        limit = self._limit
        if tokens <= 0 or (limit.tokens is None and limit.output_tokens is None):
            return
        bucket = self._bucket
        if bucket is not None:
            bucket.refill(limit, now)
            if limit.output_tokens is not None:
                bucket.output = min(float(limit.output_tokens), bucket.output + tokens)
            elif limit.tokens is not None:
                bucket.tokens = min(float(limit.tokens), bucket.tokens + tokens)
            return
        # From the attempts admitted at that instant (they leave the window together, so
        # which of them gives it back does not matter).
        window = self._window
        for i, (started, taken) in enumerate(window):
            if started == taken_at and taken > 0:
                back = min(taken, tokens)
                window[i] = (started, taken - back)
                tokens -= back
                if tokens <= 0:
                    return

    def _in_window(self, now: float, tokens: int) -> RateReport | None:
        limit, window = self._limit, self._window
        while window and window[0][0] <= now - limit.per_seconds:
            window.popleft()
        used_tokens = sum(n for _, n in window)
        over_requests = limit.requests is not None and len(window) >= limit.requests
        over_tokens = limit.tokens is not None and used_tokens + tokens > limit.tokens
        if not (over_requests or over_tokens):
            window.append((now, tokens))
            if limit.requests is None:
                return None
            left = limit.requests - len(window)
            token_report = None
            if limit.tokens is not None:
                token_report = RateReport(
                    limit=limit.tokens,
                    remaining=max(0, limit.tokens - used_tokens - tokens),
                    reset_seconds=limit.per_seconds,
                )
            return RateReport(
                limit=limit.requests,
                remaining=left,
                reset_seconds=limit.per_seconds,
                tokens=token_report,
            )
        frees = window[0][0] + limit.per_seconds - now if window else limit.per_seconds
        retry = limit.retry_after if limit.retry_after is not None else max(1.0, math.ceil(frees))
        headers = {
            "retry-after": f"{retry:g}",
            "x-ratelimit-limit-requests": str(limit.requests or ""),
            "x-ratelimit-remaining-requests": str(max(0, (limit.requests or 0) - len(window))),
            "x-ratelimit-reset-requests": f"{frees:.3f}s",
        }
        if limit.tokens is not None:
            headers["x-ratelimit-limit-tokens"] = str(limit.tokens)
            headers["x-ratelimit-remaining-tokens"] = str(max(0, limit.tokens - used_tokens))
            headers["x-ratelimit-reset-tokens"] = f"{frees:.3f}s"
        raise self._refused(headers)

    def _from_bucket(self, now: float, prompt: int, reserved: int) -> RateReport | None:
        """One request (and its tokens) taken from what has refilled, or a 429 until enough
        has; the headers say what is left once it is taken and when all of it is back."""
        limit = self._limit
        apart = limit.output_tokens is not None
        tokens, output = (prompt, reserved) if apart else (prompt + reserved, 0)
        bucket = self._bucket
        if bucket is None:
            full = float(limit.tokens or 0)
            bucket = self._bucket = _Bucket(
                float(limit.requests or 0), full, float(limit.output_tokens or 0), now
            )
        bucket.refill(limit, now)
        lacking = 0.0  # the share of a period until what is lacking has refilled
        if limit.requests is not None and bucket.requests < 1.0:
            lacking = (1.0 - bucket.requests) / limit.requests
        if limit.tokens is not None and bucket.tokens < tokens:
            lacking = max(lacking, (min(tokens, limit.tokens) - bucket.tokens) / limit.tokens)
        if limit.output_tokens is not None and bucket.output < output:
            short = min(output, limit.output_tokens) - bucket.output
            lacking = max(lacking, short / limit.output_tokens)
        if lacking <= 0.0:
            bucket.requests -= 1.0
            bucket.tokens -= tokens
            bucket.output -= output
            return self._report(bucket) if limit.requests is not None else None
        frees = lacking * limit.per_seconds
        retry = limit.retry_after if limit.retry_after is not None else max(1.0, math.ceil(frees))
        headers = {"retry-after": f"{retry:g}"}
        if limit.requests is not None:
            back = (limit.requests - bucket.requests) / limit.requests * limit.per_seconds
            headers["x-ratelimit-limit-requests"] = str(limit.requests)
            headers["x-ratelimit-remaining-requests"] = str(max(0, int(bucket.requests)))
            headers["x-ratelimit-reset-requests"] = f"{back:.3f}s"
        if limit.tokens is not None:
            back = (limit.tokens - bucket.tokens) / limit.tokens * limit.per_seconds
            headers["x-ratelimit-limit-tokens"] = str(limit.tokens)
            headers["x-ratelimit-remaining-tokens"] = str(max(0, int(bucket.tokens)))
            headers["x-ratelimit-reset-tokens"] = f"{back:.3f}s"
        raise self._refused(headers)

    def _report(self, bucket: _Bucket) -> RateReport:
        limit = self._limit
        assert limit.requests is not None
        back = (limit.requests - bucket.requests) / limit.requests * limit.per_seconds
        tokens = _state(limit.tokens, bucket.tokens, limit.per_seconds)
        output = _state(limit.output_tokens, bucket.output, limit.per_seconds)
        if output is not None and tokens is not None and not limit.report_apart:
            # Only the two together, as Anthropic's anthropic-ratelimit-tokens-* say it.
            tokens = RateReport(
                limit=tokens.limit + output.limit,
                remaining=tokens.remaining + output.remaining,
                reset_seconds=max(tokens.reset_seconds, output.reset_seconds),
            )
            output = None
        return RateReport(
            limit=limit.requests,
            remaining=int(bucket.requests),
            reset_seconds=back,
            tokens=tokens,
            output_tokens=output,
        )

    def _refused(self, headers: dict[str, str]) -> Exception:
        body = _encode({"error": {"message": "Rate limit reached", "type": "requests"}})
        return error_from_status(self._endpoint, 429, headers, body)


def _state(limit: int | None, left: float, per_seconds: float) -> RateReport | None:
    """A token limit's state once a request was taken: a request larger than the whole
    bucket was let in from a full one, so none is left."""
    if limit is None:
        return None
    back = (limit - left) / limit * per_seconds
    return RateReport(
        limit=limit, remaining=max(0, int(left)), reset_seconds=min(back, per_seconds)
    )
