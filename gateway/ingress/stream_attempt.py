"""A stream attempt: opened up to its first chunk (a hedge's primary: up to its first token)
by the failover loop's ``AttemptKind`` ``STREAM``, then relayed as a committed
``StreamAttempt`` that is observed, and gives its lease back, when it ends."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from gateway.adapters.base import Batch, carries_token, choices_asked
from gateway.formats.openai_chat import delta_chars
from gateway.http.deadline import deadline
from gateway.ingress import hedging
from gateway.ingress.failover import (
    billed_by_failure,
    outcome_of,
    timed_out,
    tokens_used_by_failure,
    unexpected,
)
from gateway.ingress.settling import NO_USAGE, shielded, tokens, usage_of
from schemas import FirstToken, ProbeFirstByte, UpstreamError, UpstreamTimeoutError, subjects
from schemas.canonical_markers import START_USAGE
from schemas.text_chunk import TextChunk, chunk_json

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from gateway.adapters.base import JSON
    from gateway.ingress.dispatch import Budget, Dispatcher
    from gateway.ingress.hedging import Declined
    from gateway.ingress.request_info import Attempt, RequestInfo


class _Stream:
    """Streams; stateless, one instance (``STREAM``)."""

    __slots__ = ()

    async def attempt(
        self,
        d: Dispatcher,
        info: RequestInfo,
        payload: JSON,
        a: Attempt,
        budget: Budget,
        declined: Declined,
        hold: bool,
    ) -> StreamAttempt | UpstreamError:
        """One observed stream attempt up to its first chunk (``hold``: up to its first
        token, see ``_first_token``): the open stream (which holds the capacity lease until
        its relay ends), or the error it failed with (the lease given back)."""
        attempt, c, more, first_of_plan, model = a
        started = d.now()
        target = d.targets.resolve(c)
        trace = info.record.trace
        if trace is not None:
            target = trace.attempt(attempt, c, target, info.surface, info.stream)
        try:
            adapter = d.adapter(c)
            if trace is not None and trace.capturing:
                adapter = trace.noting(adapter, attempt)
            chunks = adapter.stream(target, payload)
        except UpstreamError as missing:  # no adapter: nothing sent, the next may serve
            await d.observe(info, a, "failure", started, err=missing)
            await d.leases.release(c, unsent=True)
            return missing
        limit, by_budget = budget.first_byte_limit(attempt, target.ttft_timeout, more)
        outcome = "failure"
        try:
            with deadline(limit):
                first = await anext(chunks)
                if hold:
                    first = await _first_token(first, chunks, target.idle_timeout, c.endpoint)
        except StopAsyncIteration:
            err = UpstreamError(
                "upstream stream was empty", endpoint=c.endpoint, kind="empty_stream"
            )
        except UpstreamError as exc:
            err = exc
            outcome = outcome_of(err)
        except TimeoutError:
            err = timed_out(c, limit, by_budget, stream=True)
            outcome = "cancelled" if by_budget else "failure"
        except (anyio.get_cancelled_exc_class(), RecursionError):
            # RecursionError: see dispatch.ONCE (the body cannot be encoded for the upstream).
            await _aclose(chunks)
            await d.observe(info, a, "cancelled", started, err=declined.error(c.endpoint))
            await d.leases.release(c)
            raise
        except Exception as exc:  # not the route's fault, but the attempt ends
            await _aclose(chunks)
            how, why = unexpected(c.endpoint, exc)
            await d.observe(info, a, how, started, err=why)
            await d.leases.release(c)
            raise
        else:
            info.record.upstream(started, d.now())
            if trace is not None and first:
                trace.answered(attempt, chunk_json(first[0]))
            # Only a plan's primary holds its model's prefill lease. A stream whose first
            # read is its whole answer ends here: its observation, right after the relay,
            # releases that lease too, so it needs no message of its own (unless it carries
            # a provider limit's state, which only this message says).
            whole = (
                isinstance(first, Batch)
                and first.last
                and first.spent_for is None
                and first.rate is None
            )
            if first_of_plan and not whole:
                await d.publish(
                    subjects.model_first_token(model),
                    FirstToken(
                        endpoint=c.endpoint,
                        request_id=info.request_id,
                        spent_for=first.spent_for if isinstance(first, Batch) else None,
                        rate=first.rate if isinstance(first, Batch) else None,
                        credential_id=c.credential_id,
                    ),
                )
            if c.probe:  # the probe's verdict is its first byte, not the stream's end
                await d.publish(
                    subjects.endpoint_probe_result(c.endpoint),
                    ProbeFirstByte(endpoint=c.endpoint, request_id=info.request_id),
                )
            return StreamAttempt(
                d, info, a, started, first, chunks, target.idle_timeout, choices_asked(payload)
            )
        await _aclose(chunks)
        billed = billed_by_failure(err)  # an answer it could not hand on is billed all the same
        await d.observe(info, a, outcome, started, err=err, usage=billed)
        await d.leases.release(
            c, tokens(billed) if billed.reported else tokens_used_by_failure(err)
        )
        return err

    async def discard(self, result: StreamAttempt) -> None:
        """A stream that lost a hedge race after its first chunk: closed, observed declined."""
        await result.close(
            "cancelled",
            UpstreamError(
                "declined: the hedged twin answered first",
                endpoint=result.candidate.endpoint,
                kind=hedging.DECLINED,
            ),
        )


STREAM = _Stream()
"""The stream ``AttemptKind``."""


def _answers(batch: Batch) -> bool:
    """Whether ``batch`` says something of the answer: a token, a finish reason, or the end."""
    if batch.last:
        return True
    for chunk in batch:
        if carries_token(chunk):
            return True
        if not isinstance(chunk, dict):
            if chunk.finished() is not None:
                return True
            continue
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and choice.get("finish_reason"):
                return True
    return False


async def _first_token(
    first: Batch, rest: AsyncIterator[Batch], idle: float, endpoint: str
) -> Batch:
    """``first`` and the batches after it, up to the first that ``_answers``, as one batch
    (chunks unchanged, in order). A hedged stream is decided by its first token, not by a
    role-only first chunk an upstream sends at once and then stalls after; nothing of it
    has reached the client yet, so a failure here leaves the race to the other side. The
    caller's first-byte limit bounds the whole wait; ``idle`` bounds each read, as after
    commit. Raises UpstreamError (the stream broke, stalled, or ended without an answer)."""
    held = list(first)
    batch = first
    while not _answers(batch):
        try:
            with deadline(idle):
                batch = await anext(rest)
        except StopAsyncIteration:
            raise UpstreamError(
                "upstream stream ended before its first token", endpoint=endpoint, kind="truncated"
            ) from None
        except TimeoutError:
            raise UpstreamTimeoutError(
                f"upstream stream stalled before its first token: no chunk for {idle:g} s",
                endpoint=endpoint,
                kind="idle",
            ) from None
        held += batch
    if len(held) == len(first):
        return first
    return Batch(held, last=batch.last, spent_for=first.spent_for, rate=first.rate)


async def _aclose(gen: AsyncIterator[Any]) -> None:
    """Close ``gen`` however its caller is cancelled (shielded only if closing suspends)."""
    aclose = getattr(gen, "aclose", None)
    if aclose is not None:
        await shielded(aclose())


class StreamAttempt:
    """A committed stream: its first batch of chunks, the rest, and its observation when it
    ends. ``model`` is the model whose plan it belongs to."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        info: RequestInfo,
        a: Attempt,
        started: float,
        first: Batch,
        rest: AsyncIterator[Batch],
        idle_timeout: float,
        choices: int = 1,
    ) -> None:
        self._attempt = a
        self.candidate = a.candidate
        self.attempt = a.number
        self.model = a.model
        self.first = first
        self._rest = rest
        self._dispatcher = dispatcher
        self._info = info
        self._started = started
        self._ttft: float | None = None  # when the first token (or the end) arrived
        self._usage = NO_USAGE
        self._chars = 0  # content sent, for the estimate when no usage is reported
        self._finished = False  # a choice has said why it stopped
        self._unfinished = set(range(choices))  # the choices asked that have not
        self._idle = idle_timeout
        self._pending: Batch | None = first  # what ``__anext__`` gives next, unread
        self._more = not first.last  # whether ``rest`` may hold more
        self._over = False  # the batches ended (their end, or the error that ended them)
        self._note(first)

    def batches(self) -> AsyncIterator[Batch]:
        """Every batch of chunks (what one upstream read carried), the first included, up to
        the ``last`` one (iterate once). Raises UpstreamError if the stream breaks, stalls
        for the idle timeout, or ends without a finish reason (or, short of its ``last``
        batch, without one for every choice asked)."""
        return self

    def __aiter__(self) -> StreamAttempt:
        return self

    async def __anext__(self) -> Batch:
        # An iterator over itself, not an async generator: a stream pays for each layer of
        # generator between the upstream's reads and the client.
        pending = self._pending
        if pending is not None:
            self._pending = None
            return pending
        if self._over:
            raise StopAsyncIteration
        self._over = True  # unless another batch comes
        if self._more:
            try:
                with deadline(self._idle):
                    batch = await anext(self._rest)
            except StopAsyncIteration:
                # Ended cleanly (a cut connection raises) but short of the stream's own end
                # (``[DONE]``, a ``last`` batch): whole only if every choice said why it stopped.
                if self._finished and self._unfinished:
                    raise UpstreamError(
                        "upstream stream ended without [DONE] before every choice finished",
                        endpoint=self.candidate.endpoint,
                        kind="truncated",
                    ) from None
            except TimeoutError:
                raise UpstreamTimeoutError(
                    f"upstream stream stalled: no chunk for {self._idle:g} s",
                    endpoint=self.candidate.endpoint,
                    kind="idle",
                ) from None
            else:
                self._over = False
                self._more = not batch.last
                self._note(batch)
                return batch
        if not self._finished:
            # A clean end that never said why the answer stopped may be cut short.
            raise UpstreamError(
                "upstream stream ended without a finish reason",
                endpoint=self.candidate.endpoint,
                kind="truncated",
            )
        raise StopAsyncIteration

    def _note(self, batch: Batch) -> None:
        """Keep the latest usage, the characters sent, whether a choice has said why it
        stopped, and when the first token came (a role-only chunk is none; an answer that
        ends without any token has its TTFT at its end)."""
        if self._ttft is None and _answers(batch):
            self._ttft = self._dispatcher.now()
        for chunk in batch:
            if type(chunk) is TextChunk:  # text: no usage; no choice, or one at index 0
                chars, reason = chunk.noted()
                self._chars += chars
                if reason is not None and self._unfinished:
                    self._finish(0, reason)
                continue
            if chunk.get("usage"):
                self._usage = usage_of(chunk)
            elif self._usage is NO_USAGE and (start := chunk.get(START_USAGE)):
                # The prompt a stream's start reported (Claude's message_start): what a stream
                # cut or left before its usage chunk is billed on, not the prompt's estimate.
                self._usage = usage_of({"usage": start})._replace(reported=False)
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta")
                if delta:
                    self._chars += delta_chars(delta)
                if self._unfinished and choice.get("finish_reason"):
                    self._finish(choice.get("index", 0), choice["finish_reason"])

    def _finish(self, index: Any, reason: str) -> None:
        """Choice ``index`` said why it stopped (the first to say it goes on the trace)."""
        self._unfinished.discard(index)
        if self._finished:
            return
        self._finished = True
        if self._info.record.trace is not None:
            self._info.record.trace.finished(self.attempt, reason)

    async def close(self, outcome: str, err: UpstreamError | None = None) -> None:
        """Release the upstream stream and the capacity lease, and publish this attempt's
        observation (closing twice releases once)."""
        await _aclose(self._rest)
        await self._dispatcher.leases.release(self.candidate, tokens(self._usage))
        await self._dispatcher.observe(
            self._info,
            self._attempt,
            outcome,
            self._started,
            err=err,
            ttft=self._ttft,
            usage=self._usage,
            sent_chars=self._chars,
            committed=True,  # relayed: a failure now goes to no other route
            # A plan's primary said it with its FirstToken already; a fallback says it here.
            rate=None if self._attempt.first_of_plan else self.first.rate,
        )
