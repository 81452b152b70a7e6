"""What an upstream's status and headers say: the UpstreamError of a non-2xx answer, and how
long it asks to be left alone (``Retry-After``, the ``x-ratelimit-*`` headers OpenAI-style
providers send), and how much of its message a client's error carries (:func:`clipped`).
Pure functions; ``adapters.base`` re-exports them for the adapters.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import re
import time
from typing import TYPE_CHECKING, Any

import msgspec

from schemas import QUOTA_EXHAUSTED, RATE_LIMIT_EXCEEDED, UpstreamError
from schemas.routing import RateReport

if TYPE_CHECKING:
    from collections.abc import Mapping


LONGEST_WAIT = 86_400.0
"""Seconds: no provider's window is longer than a day; a longer wait counts as a day (a
Retry-After of 1e300 kept the key cooling for good)."""
# No provider's limit is near this; a larger number (Python reads thousands of digits) would
# overflow the float a pace keeps it in.
_LARGEST_LIMIT = 10**12


MESSAGE_MAX = 2000
"""Characters of an upstream's message a client's error carries. A provider's message is a
sentence or two; an upstream once sent a 64 MiB one, which the client got verbatim."""


def clipped(message: str) -> str:
    """``message`` cut to :data:`MESSAGE_MAX` characters, an ellipsis ending a cut one. Clip
    after redacting: a credential cut in two would no longer be found."""
    if len(message) <= MESSAGE_MAX:
        return message
    return message[: MESSAGE_MAX - 1] + "\u2026"


def wait_hint(seconds: float | None) -> float | None:
    """A provider's wait as a hint: a positive, finite number of seconds; None for anything
    else. ``0`` or less says nothing usable: a request that took it at its word would send
    the refused request again at once, as often as its attempts allow (the refusal is still
    back-pressure: the caller's own backoff applies). NaN and infinity are malformed."""
    if seconds is None or not 0.0 < seconds < math.inf:
        return None
    return min(seconds, LONGEST_WAIT)


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The ``Retry-After`` header in seconds when it asks for a wait, or None: a number of
    seconds, or an HTTP date (RFC 9110 allows both) counted from now."""
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return wait_hint(float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT; an obsolete form may not say so
        when = when.replace(tzinfo=datetime.UTC)
    return wait_hint(when.timestamp() - time.time())


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(value: str) -> float | None:
    """Seconds from a Go-style duration as OpenAI's ``x-ratelimit-reset-*`` headers send it
    (``"1s"``, ``"6m0s"``, ``"20ms"``, ``"1h2m3.5s"``) or a bare number of seconds; None when
    it is neither."""
    text = value.strip().lower()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    total, pos = 0.0, 0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    return total if pos == len(text) and pos > 0 and math.isfinite(total) else None


def rate_limit_reset_seconds(headers: Mapping[str, str]) -> float | None:
    """How long a 429 asks the caller to wait: ``Retry-After``, else ``retry-after-ms``, else
    the ``x-ratelimit-reset-*`` header of the limit that ran out (``x-ratelimit-remaining-*``
    at 0; when none says so, the shortest reset given). None when the answer says nothing,
    or no wait (0 or less) or a malformed one (:func:`wait_hint`)."""
    after = retry_after_seconds(headers)
    if after is not None:
        return after
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            after = wait_hint(float(ms) / 1000.0)
        except ValueError:
            pass
        if after is not None:
            return after
    resets: dict[str, float] = {}
    for limit in ("requests", "tokens"):
        raw = headers.get(f"x-ratelimit-reset-{limit}")
        seconds = duration_seconds(raw) if raw is not None else None
        if seconds is not None:
            resets[limit] = seconds
    spent = [
        s for limit, s in resets.items() if headers.get(f"x-ratelimit-remaining-{limit}") == "0"
    ]
    if spent:
        return wait_hint(max(spent))
    return wait_hint(min(resets.values())) if resets else None


def rate_limit_spent_seconds(
    headers: Mapping[str, str], *, paced: RateReport | None = None
) -> float | None:
    """How long a successful answer's provider will refuse the next request: a limit whose
    ``x-ratelimit-remaining-*`` is 0, until its ``x-ratelimit-reset-*`` (a second when that
    says nothing); None when no limit is spent (or the provider sends no such headers).
    ``paced``: the answer's :func:`rate_report`, by which the model paces the limits it
    reports, so only a limit it does not is read here (the reset is the whole allowance's:
    waiting for it would leave the route idle long after its first request came back)."""
    limits = _SPENDABLE
    if paced is not None:
        limits = () if paced.tokens is not None else _SPENDABLE[1:]
    spent: list[float] = []
    for remaining_header, reset_header in limits:
        remaining = headers.get(remaining_header)
        if remaining is None or remaining.strip() != "0":
            continue
        raw = headers.get(reset_header)
        seconds = duration_seconds(raw) if raw is not None else None
        spent.append(1.0 if seconds is None else min(seconds, LONGEST_WAIT))
    return max(spent) if spent else None


_SPENDABLE = tuple(
    (f"x-ratelimit-remaining-{limit}", f"x-ratelimit-reset-{limit}")
    for limit in ("requests", "tokens")
)
"""The headers of each limit :func:`rate_limit_spent_seconds` reads (every stream asks)."""


def rate_report(headers: Mapping[str, str]) -> RateReport | None:
    """The request rate limit's state an answer's headers report: OpenAI's
    (``x-ratelimit-limit-requests``, ``-remaining-requests`` and ``-reset-requests``, the
    reset a duration) or Anthropic's (``anthropic-ratelimit-requests-limit``, ``-remaining``
    and ``-reset``, the reset an RFC 3339 time); None unless all three of one are there and
    well formed. Its token limit's the same way (``x-ratelimit-*-tokens``; Anthropic's
    ``anthropic-ratelimit-tokens-*``, its input and output limits together) in ``tokens``
    when the answer reports all three; Anthropic's input and output limits apart
    (``anthropic-ratelimit-input-tokens-*`` in ``tokens``, ``-output-tokens-*`` in
    ``output_tokens``) when it reports all six, since a request may fit the two together
    and not the output alone."""
    if "x-ratelimit-limit-requests" in headers:
        read = _openai_limit
    elif "anthropic-ratelimit-requests-limit" in headers:
        read = _anthropic_limit
    else:
        return None
    requests = read(headers, "requests")
    if requests is None:
        return None
    tokens, output = read(headers, "tokens"), None
    if read is _anthropic_limit:
        output = read(headers, "output-tokens")
        apart = read(headers, "input-tokens") if output is not None else None
        tokens, output = (tokens, None) if apart is None else (apart, output)
    return RateReport(
        limit=requests[0],
        remaining=requests[1],
        reset_seconds=requests[2],
        tokens=_report(tokens),
        output_tokens=_report(output),
    )


def _report(state: _LimitState | None) -> RateReport | None:
    if state is None:
        return None
    return RateReport(limit=state[0], remaining=state[1], reset_seconds=state[2])


_LimitState = tuple[int, int, float]  # (limit, remaining, seconds until all is back)


def _openai_limit(headers: Mapping[str, str], unit: str) -> _LimitState | None:
    raw_reset = headers.get(f"x-ratelimit-reset-{unit}")
    reset = duration_seconds(raw_reset) if raw_reset is not None else None
    return _limit_state(
        headers.get(f"x-ratelimit-limit-{unit}"),
        headers.get(f"x-ratelimit-remaining-{unit}"),
        reset,
    )


def _anthropic_limit(headers: Mapping[str, str], unit: str) -> _LimitState | None:
    prefix = f"anthropic-ratelimit-{unit}"
    reset = _seconds_until(headers.get(f"{prefix}-reset"), headers)
    return _limit_state(headers.get(f"{prefix}-limit"), headers.get(f"{prefix}-remaining"), reset)


def _limit_state(
    raw_limit: str | None, raw_left: str | None, reset: float | None
) -> _LimitState | None:
    """A limit's state from its three values; None unless all are there and well formed."""
    if raw_limit is None or raw_left is None or reset is None:
        return None
    try:
        limit, left = int(raw_limit.strip()), int(raw_left.strip())
    except ValueError:
        return None
    if not 0 < limit <= _LARGEST_LIMIT or not 0 <= left <= limit:
        return None
    return limit, left, min(reset, LONGEST_WAIT)


def _seconds_until(stamp: str | None, headers: Mapping[str, str]) -> float | None:
    """Seconds until an RFC 3339 time (0 once past) from when the answer's ``Date`` says it
    was sent (the provider's clock, not this host's; this host's without one); None when
    ``stamp`` is not such a time."""
    if stamp is None:
        return None
    try:
        when = datetime.datetime.fromisoformat(stamp.strip())
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    sent = time.time()
    if (date := headers.get("date")) is not None:
        try:
            sent = email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            pass
    return max(0.0, when.timestamp() - sent)


# The headers by which a provider reports what is left of a rate limit (OpenAI, Azure and
# most compatible providers; Anthropic).
_RATE_STATE_HEADERS = (
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-output-tokens-remaining",
)


def meters_rate(headers: Mapping[str, str]) -> bool:
    """Whether an answer's headers report a rate limit's state (what is left of a limit of
    requests or tokens per period): a 429 that carries them refused a pace, not a
    concurrency."""
    return any(name in headers for name in _RATE_STATE_HEADERS)


# A 429 that says the account is out of money or quota, not that it goes too fast: the key is
# muted like any key-specific failure instead of cooling for seconds.
_QUOTA_MARKERS = (
    b"insufficient_quota",
    b"exceeded your current quota",
    b"billing_hard_limit",
    b"billing_not_active",
    b"credit balance",
)


def error_from_status(
    endpoint: str, status: int, headers: Mapping[str, str], body: bytes
) -> UpstreamError:
    """An UpstreamError for a non-2xx answer, keeping the upstream's message when it has one
    (whole: the adapter seam clips it once it is redacted, ``base.redacted``).

    A 429 carries when to come back (:func:`rate_limit_reset_seconds`); one that says a quota
    or the billing is exhausted has kind :data:`schemas.QUOTA_EXHAUSTED`, one whose headers
    say a rate limit is metered :data:`schemas.RATE_LIMIT_EXCEEDED`."""
    message = _upstream_message(body) or f"upstream answered HTTP {status}"
    kind = f"http_{status}"
    if status == 429:
        retry_after = rate_limit_reset_seconds(headers)
        lowered = body.lower()
        if any(marker in lowered for marker in _QUOTA_MARKERS):
            kind = QUOTA_EXHAUSTED
        elif meters_rate(headers):
            kind = RATE_LIMIT_EXCEEDED
    else:
        retry_after = retry_after_seconds(headers)
    return UpstreamError(
        message,
        endpoint=endpoint,
        status=status,
        body=body,
        retry_after=retry_after,
        kind=kind,
    )


def error_object(body: bytes) -> dict[str, Any]:
    """An error answer's body as a JSON object; empty when it is none (not JSON, nested past
    what a decode takes: the upstream's, never a RecursionError read as the request's)."""
    try:
        data = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _upstream_message(body: bytes) -> str | None:
    data = error_object(body)
    err = data.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    if isinstance(err, str):
        return err
    if isinstance(data.get("message"), str):
        return str(data["message"])
    return None
