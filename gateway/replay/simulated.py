"""The simulated upstream: one ``Adapter`` answering as the providers file says, on the loop's
(virtual) time.

Per route it keeps what a real provider keeps: requests in flight against its capacity (the
rest wait in a FIFO queue, so their TTFT grows with it), a sliding rate-limit window
(beyond it a 429 with ``Retry-After`` and ``x-ratelimit-*`` headers, through the same
``error_from_status`` as a real HTTP answer), outage windows, drift and random failures.
Every random draw comes from one ``random.Random`` per route seeded from the replay's seed,
so a replay is repeatable. What it bills (tokens per route) is kept in ``billed``, and what
the gateway's background probes cost (``for_probes()``, the same routes) in ``probes``.
"""

from __future__ import annotations

import asyncio
import copy
import math
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from random import Random
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.adapters.base import JSON, Batch, UpstreamTarget, bad_response, error_from_status
from schemas import UpstreamError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from gateway.replay.providers import ErrorRates, Provider, ProvidersFile

CHARS_PER_TOKEN = 4
"""The prompt a trace request carries is this many characters per token (the gateway's own
estimate divides by the same)."""

_encode = msgspec.json.Encoder().encode
_STALL_SECONDS = 86_400.0
_READ_SECONDS = 5.0


@dataclass(slots=True)
class Billed:
    """Tokens a route answered (its provider's bill, before prices)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class _Route:
    """One simulated provider's state."""

    provider: Provider
    rng: Random
    in_flight: int = 0
    queue: deque[asyncio.Future[None]] = field(default_factory=deque)
    window: deque[tuple[float, int]] = field(default_factory=deque)  # (started, tokens)


IMAGE_TOKENS = 85
"""The prompt tokens a simulated provider bills per image (a low-detail image's price)."""


def prompt_tokens_of(body: JSON) -> int:
    """The prompt tokens a request carries: its messages' text and its tool definitions'
    JSON length / CHARS_PER_TOKEN, plus IMAGE_TOKENS per image."""
    chars = images = 0
    for m in body.get("messages") or ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    chars += len(part["text"])
                elif kind == "image_url":
                    images += 1
    tools = body.get("tools")
    if tools:
        chars += len(_encode(tools))
    return max(1, chars // CHARS_PER_TOKEN + images * IMAGE_TOKENS)


def called_tool(body: JSON) -> str | None:
    """The tool the answer calls: the named one of ``tool_choice``, or the first tool when
    ``tool_choice`` is ``required`` (None: the answer is text)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not tools or not isinstance(tools, list):
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        return str(name) if name else None
    if choice == "required":
        first = tools[0].get("function") if isinstance(tools[0], dict) else None
        return str(first.get("name") or "tool") if isinstance(first, dict) else "tool"
    return None


def output_tokens_of(body: JSON) -> int:
    """The answer's length: the request's ``max_tokens`` (the trace sets it to the length)."""
    n = body.get("max_tokens") or body.get("max_completion_tokens") or 1
    return max(1, int(n))


class SimulatedAdapter:
    """An ``Adapter`` for every simulated route. ``now`` is the loop's clock and ``origin``
    the virtual time of the trace's start. Raises UpstreamError as a real adapter would."""

    def __init__(
        self, providers: ProvidersFile, seed: int, now: Callable[[], float], origin: float
    ) -> None:
        self._providers = providers
        self._seed = seed
        self._now = now
        self.origin = origin
        self._routes: dict[str, _Route] = {}
        self.billed: dict[str, Billed] = {}
        self.probes: dict[str, Billed] = {}
        self._ledger = self.billed

    def for_probes(self) -> SimulatedAdapter:
        """The same simulated routes (state, queues, windows, draws) billing to ``probes``:
        the adapter the background probers get."""
        view = copy.copy(self)
        view._ledger = self.probes
        return view

    def _route(self, target: UpstreamTarget) -> _Route:
        route = self._routes.get(target.endpoint)
        if route is None:
            provider = self._providers.for_route(target.endpoint, target.base_url)
            if provider is None:
                raise UpstreamError(
                    f"the providers file describes no route {target.endpoint}",
                    endpoint=target.endpoint,
                    kind="connect",
                )
            route = _Route(provider, Random(f"{self._seed}:{target.endpoint}"))
            self._routes[target.endpoint] = route
        return route

    # -- the Adapter protocol ------------------------------------------------------------

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        """The whole answer once generated."""
        route, prompt, output, kind = self._admit(target, body)
        async with self._slot(route):
            await asyncio.sleep(self._ttft(route, prompt, kind))
            if kind == "empty":
                raise bad_response(target.endpoint, "an empty body")
            await asyncio.sleep((output - 1) / route.provider.output_tps)
        self._bill(target.endpoint, prompt, output)
        tool = called_tool(body)
        message: dict[str, Any] = {"role": "assistant", "content": "x" * output}
        if tool is not None:
            function = {"name": tool, "arguments": _arguments(output)}
            call = {"id": "call_sim", "type": "function", "function": function}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return {
            "id": "chatcmpl-sim",
            "object": "chat.completion",
            "created": 0,
            "model": target.upstream_model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "stop" if tool is None else "tool_calls",
                }
            ],
            "usage": _usage(prompt, output),
        }

    async def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        """The first token after the TTFT, the rest at the route's output rate (a tool call's
        arguments as a text's content)."""
        route, prompt, output, kind = self._admit(target, body)
        base = {"id": "chatcmpl-sim", "object": "chat.completion.chunk", "created": 0}
        base["model"] = target.upstream_model
        tool = called_tool(body)
        delta = _text_delta if tool is None else _arguments_delta
        async with self._slot(route):
            await asyncio.sleep(self._ttft(route, prompt, kind))
            if kind == "empty":
                return
            first: dict[str, Any] = {"index": 0, "delta": {"role": "assistant", "content": "x"}}
            if tool is not None:
                opening = {"name": tool, "arguments": '{"query": "'}
                call = {"index": 0, "id": "call_sim", "type": "function", "function": opening}
                first = {"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}}
            yield Batch(
                [{**base, "choices": [{**first, "finish_reason": None}]}],
                spent_for=self._spent_for(route),
            )
            left, tps = output - 1, route.provider.output_tps
            # One read per _READ_SECONDS of generation: idle timeouts see a live stream.
            per_read = max(1, int(tps * _READ_SECONDS))
            while left > per_read:
                await asyncio.sleep(per_read / tps)
                left -= per_read
                piece = {"index": 0, "delta": delta("x" * per_read), "finish_reason": None}
                yield Batch([{**base, "choices": [piece]}])
            await asyncio.sleep(left / tps)
            tail = "x" * left if tool is None else "x" * left + '"}'
            rest = {"index": 0, "delta": delta(tail), "finish_reason": None}
            end = "stop" if tool is None else "tool_calls"
            done = {"index": 0, "delta": {}, "finish_reason": end}
            self._bill(target.endpoint, prompt, output)
            yield Batch(
                [
                    {**base, "choices": [rest]},
                    {**base, "choices": [done]},
                    {**base, "choices": [], "usage": _usage(prompt, output)},
                ],
                last=True,
            )

    async def embed(self, target: UpstreamTarget, body: JSON) -> JSON:
        """Embeddings are not simulated: a bad response."""
        raise bad_response(target.endpoint, "the simulator answers chat only")

    # -- behaviour -----------------------------------------------------------------------

    def _admit(self, target: UpstreamTarget, body: JSON) -> tuple[_Route, int, int, str | None]:
        """The route, prompt and output tokens of an attempt the provider accepts and the
        failure it will show once served (``stall``, ``empty``); raises the UpstreamError of
        an outage, a rate limit or a failure drawn to come at once."""
        route = self._route(target)
        prompt, output = prompt_tokens_of(body), output_tokens_of(body)
        now = self._now()
        p = route.provider
        outage = p.outage_at(now - self.origin)
        rates = p.errors
        if outage is not None and outage.errors is not None:
            rates = outage.errors
        elif outage is not None and outage.kind == "stall":
            return route, prompt, output, "stall"
        elif outage is not None:
            raise _failure(target.endpoint, outage.kind)
        self._rate_limit(route, target.endpoint, now, prompt + output)
        kind = _draw(route.rng, rates)
        if kind in ("http_500", "http_503", "http_401", "reset"):
            raise _failure(target.endpoint, kind)
        return route, prompt, output, kind

    def _spent_for(self, route: _Route) -> float | None:
        """What the answer's ``x-ratelimit-remaining-requests`` of 0 would say: seconds until
        the window frees (None while requests remain, or with no request limit)."""
        limit = route.provider.rate_limit
        if limit is None or limit.requests is None:
            return None
        now, window = self._now(), route.window
        while window and window[0][0] <= now - limit.per_seconds:
            window.popleft()
        if len(window) < limit.requests:
            return None
        return max(0.0, window[0][0] + limit.per_seconds - now)

    def _rate_limit(self, route: _Route, endpoint: str, now: float, tokens: int) -> None:
        """Count the attempt in the window, or raise the 429 a provider answers beyond it."""
        limit = route.provider.rate_limit
        if limit is None:
            return
        window = route.window
        while window and window[0][0] <= now - limit.per_seconds:
            window.popleft()
        used_tokens = sum(n for _, n in window)
        over_requests = limit.requests is not None and len(window) >= limit.requests
        over_tokens = limit.tokens is not None and used_tokens + tokens > limit.tokens
        if not (over_requests or over_tokens):
            window.append((now, tokens))
            return
        frees = window[0][0] + limit.per_seconds - now if window else limit.per_seconds
        retry = limit.retry_after if limit.retry_after is not None else max(1.0, math.ceil(frees))
        headers = {
            "retry-after": f"{retry:g}",
            "x-ratelimit-limit-requests": str(limit.requests or ""),
            "x-ratelimit-remaining-requests": str(max(0, (limit.requests or 0) - len(window))),
            "x-ratelimit-reset-requests": f"{frees:.3f}s",
        }
        body = _encode({"error": {"message": "Rate limit reached", "type": "requests"}})
        raise error_from_status(endpoint, 429, headers, body)

    def _ttft(self, route: _Route, prompt: int, kind: str | None) -> float:
        """This attempt's unloaded TTFT: lognormal, drifted, longer for a longer prompt (a
        stall: a day, which the gateway's timeouts cut short)."""
        p = route.provider
        median = p.ttft.median + p.ttft.per_1k_prompt * prompt / 1000.0
        sample = median * math.exp(p.ttft.sigma * route.rng.gauss(0.0, 1.0))
        if kind == "stall":
            return _STALL_SECONDS
        return sample * p.ttft_factor(self._now() - self.origin)

    @asynccontextmanager
    async def _slot(self, route: _Route) -> AsyncIterator[None]:
        """Hold one of the route's capacity slots, waiting in FIFO order for one."""
        cap = route.provider.capacity
        if cap is not None and (route.in_flight >= cap or route.queue):
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            route.queue.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    route.in_flight -= 1
                    _hand_on(route)  # it was handed a slot it will not use
                elif waiter in route.queue:  # not yet passed over by _hand_on
                    route.queue.remove(waiter)
                raise
        else:
            route.in_flight += 1
        try:
            yield
        finally:
            route.in_flight -= 1
            _hand_on(route)

    def _bill(self, endpoint: str, prompt: int, output: int) -> None:
        billed = self._ledger.setdefault(endpoint, Billed())
        billed.prompt_tokens += prompt
        billed.completion_tokens += output


def _hand_on(route: _Route) -> None:
    """Give a free slot to the first waiter still waiting."""
    while route.queue:
        waiter = route.queue.popleft()
        if not waiter.done():
            route.in_flight += 1
            waiter.set_result(None)
            return


def _draw(rng: Random, rates: ErrorRates) -> str | None:
    """One failure kind drawn from ``rates`` (None: no failure)."""
    x = rng.random()
    for kind, p in rates:
        if x < p:
            return str(kind)
        x -= p
    return None


def _text_delta(text: str) -> dict[str, Any]:
    return {"content": text}


def _arguments_delta(text: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}


def _arguments(output: int) -> str:
    """A tool call's arguments about ``output`` tokens long (JSON)."""
    return '{"query": "' + "x" * max(1, output) + '"}'


def _usage(prompt: int, output: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}


def _failure(endpoint: str, kind: str) -> UpstreamError:
    """The UpstreamError a real adapter raises for ``kind``."""
    if kind.startswith("http_"):
        status = int(kind[5:])
        body = _encode({"error": {"message": f"simulated {status}"}})
        return error_from_status(endpoint, status, {}, body)
    if kind == "connect":
        return UpstreamError("upstream connection failed (simulated)", endpoint=endpoint, kind=kind)
    return UpstreamError(
        "upstream connection reset (simulated)", endpoint=endpoint, kind="transport"
    )
