"""Usage and cost accounting of one attempt: the tokens an upstream reported (or the estimate
when it reported none), their price, and the ``Observation`` that carries them."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from schemas import Observation
from schemas.pricing import cost_usd

if TYPE_CHECKING:
    from gateway.adapters.base import JSON
    from gateway.ingress.request_info import RequestInfo
    from schemas import RouteCandidate, UpstreamError
    from schemas.pricing import Pricing


class Usage(NamedTuple):
    """Tokens an upstream reported (``reported`` False: it reported none)."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0
    cache_written: int = 0
    reported: bool = False


NO_USAGE = Usage()
CHARS_PER_TOKEN = 4  # the estimate's ratio, as the prompt estimate's


def usage_of(body: JSON) -> Usage:
    """The tokens of an OpenAI-shaped ``usage`` (Anthropic's cache writes arrive in
    ``prompt_tokens_details.cache_write_tokens``, see adapters/_anthropic_to_canonical.py)."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return NO_USAGE
    details = usage.get("prompt_tokens_details")
    cached = written = 0
    if isinstance(details, dict):
        cached = details.get("cached_tokens") or 0
        written = details.get("cache_write_tokens") or 0
    return Usage(
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
        int(cached),
        int(written),
        True,
    )


def content_chars(body: JSON) -> int:
    """Characters of a chat answer's content and tool arguments (what the estimate prices
    when the upstream reports no usage)."""
    total = 0
    for choice in body.get("choices") or ():
        message = choice.get("message") or {} if isinstance(choice, dict) else {}
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        for call in message.get("tool_calls") or ():
            args = (call.get("function") or {}).get("arguments") if isinstance(call, dict) else None
            if isinstance(args, str):
                total += len(args)
    return total


def tokens(usage: Usage) -> int | None:
    """Prompt plus completion tokens an upstream reported; None when it reported none."""
    total = usage.prompt + usage.completion
    return total or None


def observation(
    info: RequestInfo,
    model: str,
    c: RouteCandidate,
    attempt: int,
    outcome: str,
    started: float,
    now: float,
    ts: float,
    pricing: Pricing | None,
    *,
    err: UpstreamError | None = None,
    ttft: float | None = None,
    usage: Usage = NO_USAGE,
    sent_chars: int = 0,
) -> Observation:
    """The Observation of one attempt at ``model`` that ended at ``now`` (``ts``: wall clock),
    priced by ``pricing``; an answer without reported usage is billed on the estimate."""
    prompt, completion = usage.prompt, usage.completion
    estimated = not usage.reported and (outcome == "success" or sent_chars > 0)
    if estimated:
        prompt = info.prompt_estimate
        completion = -(-sent_chars // CHARS_PER_TOKEN)
    cost = (
        0.0  # an unpriced route costs nothing, as ``cost_usd`` says: no need to ask it
        if pricing is None
        else cost_usd(
            pricing,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cache_read_tokens=usage.cached,
            cache_write_tokens=usage.cache_written,
        )
    )
    return Observation(
        endpoint=c.endpoint,
        model=model,
        outcome=outcome,
        attempt=attempt,
        status=err.status if err is not None else 200,
        error_kind=err.kind if err is not None else "",
        auth_rejection=bool(err is not None and err.is_auth_rejection),
        probe=c.probe,
        stream=info.stream,
        fallback=attempt > 1,
        ttft_ms=(ttft - started) * 1000 if ttft is not None else None,
        latency_ms=(now - started) * 1000,
        prompt_tokens=usage.prompt,
        completion_tokens=usage.completion,
        cached_tokens=usage.cached,
        cache_write_tokens=usage.cache_written,
        cost_usd=cost,
        cost_estimated=estimated,
        billed_tokens=prompt + completion,
        retry_after=err.retry_after if err is not None else None,
        caller=info.caller,
        request_id=info.request_id,
        surface=info.surface,
        credential_id=c.credential_id,
        ts=ts,
        prompt_estimate=info.prompt_estimate,
        role=info.role,
        trace_id=info.record.trace.trace_id if info.record.trace is not None else "",
    )
