"""What RouteWise has learned: TTFT profiles, output lengths and the cost envelope.

All three are fed by observations (live, replayed from the request log at startup with the
rows' own timestamps, or from the active prober) and read with an explicit ``now``, so an
injected clock drives them in tests and replays.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import TYPE_CHECKING

from llm_routewise.core.latency_profile import RollingLatencyProfile

if TYPE_CHECKING:
    from actors.strategies.routewise.params import RouteWiseParams

# A failed attempt weighs in the mean TTFT as this (the library's default penalty).
ERROR_PENALTY_MS = 60_000.0
# The moving mean of slot holding times follows about the last twenty answers.
_HOLD_ALPHA = 0.05
# What the cost envelope keeps per window at most: its percentiles need no more.
ENVELOPE_MAX_SAMPLES = 10_000
_NEVER = float("-inf")


class SampleThinner:
    """Bounds how many samples a rolling window keeps, at any request rate.

    A token bucket: the first ``budget / 20`` samples (at least one) are taken at once, so a
    cold route learns from its first requests, and then at most ``budget`` per ``window``
    seconds, evenly over time. The kept samples stay an even draw over the window, so their
    mean and distribution track those of every sample; a window never holds more than about
    ``budget`` of them. O(1) per sample. A sample older than the newest one weighed (replayed
    rows, another ingress's clock) refills nothing.

    ``due``: before it no sample is kept, so a caller on a hot path may skip ``admit`` for a
    sample older than it (the bucket fills in a straight line: weighing it later gives the
    same count).
    """

    def __init__(self, budget: int, window_sec: float) -> None:
        self._burst = max(1.0, budget / 20.0)
        self._rate = max(budget - self._burst, 1.0) / window_sec
        self._tokens = self._burst
        self._last = _NEVER
        self.due = _NEVER

    def admit(self, ts: float) -> bool:
        """Whether the sample at ``ts`` is kept (and takes a token)."""
        if ts < self.due:
            return False
        if ts > self._last:
            if self._last != _NEVER:
                self._tokens = min(self._burst, self._tokens + (ts - self._last) * self._rate)
            self._last = ts
        kept = self._tokens >= 1.0
        if kept:
            self._tokens -= 1.0
        # When the next token is whole (now, while one is left).
        self.due = (
            _NEVER if self._tokens >= 1.0 else (self._last + (1.0 - self._tokens) / self._rate)
        )
        return kept


class TtftWindow:
    """One rolling TTFT window of one endpoint: successes in the library's profile (its mean
    and CDF queries are incremental), failed attempts as a sorted list of their times (the
    library would count those by scanning every one on each query), both thinned by one
    ``SampleThinner`` so the share of failures is kept."""

    def __init__(self, window_sec: float, budget: int, failure_idle: float = 0.0) -> None:
        self.window_sec = window_sec
        # Once no attempt has gone to the route for this long (0: never), its failures so
        # far stop weighing, for good: the LP, which left it for them, tries it again on its
        # successes' evidence, so a route back from an outage gets its traffic back (one
        # still down fails again, and the fast mean moves off it at once). A route that
        # keeps its traffic keeps its failures' whole weight.
        self.failure_idle = failure_idle
        self.profile = RollingLatencyProfile(window_sec=window_sec)
        self._thinner = SampleThinner(budget, window_sec)
        self._errors: list[float] = []
        self._last = _NEVER  # the newest attempt seen, kept or thinned
        # Counts what may move its mean: every kept success, every failure, the failures
        # forgotten after an idle spell (not the successes it thinned away).
        self.changes = 0

    def success(self, ts: float, ttft_ms: float) -> None:
        """A first token ``ttft_ms`` after its attempt began, at ``ts``."""
        # _seen, inline (once per answer and window)
        if 0 < self.failure_idle <= ts - self._last and self._errors:
            self._errors.clear()
            self.changes += 1
        if ts > self._last:
            self._last = ts
        if ts >= self._thinner.due and self._thinner.admit(ts):
            self.profile.add_sample(ts, ttft_ms)
            self.changes += 1

    def failure(self, ts: float) -> None:
        """An attempt that failed before its first token, at ``ts``."""
        self._seen(ts)
        self.changes += 1
        if not self._thinner.admit(ts):
            return
        bisect.insort(self._errors, ts)
        # Keep two windows (what the library keeps of successes); drop the rest in one cut.
        horizon = self._errors[-1] - 2.0 * self.window_sec
        if self._errors[0] < horizon:
            del self._errors[: bisect.bisect_left(self._errors, horizon)]

    def _seen(self, ts: float) -> None:
        """An attempt at ``ts``: after an idle spell, the failures before it are forgotten."""
        if self._idle(ts):
            self._errors.clear()
        self._last = max(self._last, ts)

    def _idle(self, now: float) -> bool:
        return 0 < self.failure_idle <= now - self._last

    def errors(self, now: float) -> int:
        """Failed attempts inside the window at ``now`` (none while the route is idle past
        ``failure_idle``: forgotten)."""
        if self._idle(now):
            return 0
        lo = bisect.bisect_left(self._errors, now - self.window_sec)
        return bisect.bisect_right(self._errors, now) - lo

    def samples(self, now: float) -> int:
        """Successes and failures inside the window at ``now``."""
        return self.profile.count(now) + self.errors(now)

    def mean_with_errors(self, now: float) -> float | None:
        """Mean TTFT at ``now``, each failure counted as ERROR_PENALTY_MS; None when empty."""
        mean = self.profile.mean(now)
        failed = self.errors(now)
        if not failed:
            return mean
        n = self.profile.count(now)
        return ((mean or 0.0) * n + failed * ERROR_PENALTY_MS) / (n + failed)

    def cdf_counting_errors(self, ttft_ms: float, now: float) -> float | None:
        """``P(TTFT <= ttft_ms)`` at ``now``, failures counted as misses; None when empty."""
        cdf = self.profile.cdf(ttft_ms, now)
        failed = self.errors(now)
        if not failed:
            return cdf
        n = self.profile.count(now)
        return (cdf or 0.0) * n / (n + failed)


class FastMean:
    """A time-decayed mean of the last few seconds of one endpoint's TTFTs (failures at
    ERROR_PENALTY_MS): each sample's weight halves every ``tau`` seconds, so a change shows
    within a few seconds of traffic while an idle endpoint's weight fades to nothing."""

    __slots__ = ("mean", "tau", "ts", "weight")

    def __init__(self, tau: float) -> None:
        self.tau = tau
        self.mean = 0.0
        self.weight = 0.0
        self.ts = _NEVER

    def add(self, ts: float, value: float) -> None:
        """One sample at ``ts`` (an older one counts as if at the newest seen)."""
        w = self.weight
        if ts > self.ts:  # the weight so far, decayed to ts
            w *= math.pow(0.5, (ts - self.ts) / self.tau)
            self.ts = ts
        self.mean = (self.mean * w + value) / (w + 1.0)
        self.weight = w + 1.0

    def blend(self, prior: float, prior_weight: float, now: float) -> float:
        """``prior`` (the long window's mean) weighing ``prior_weight`` samples, moved by
        what the last seconds said."""
        w = self.weight
        if now > self.ts:  # the weight so far, decayed to now
            w *= math.pow(0.5, (now - self.ts) / self.tau)
        return (self.mean * w + prior * prior_weight) / (w + prior_weight)


class LatencyEvidence:
    """Per-endpoint TTFT windows: the live one, and the long history as a prior, and a fast
    time-decayed mean of the last seconds (``latency_fast_half_life_sec``).

    ``estimate`` is the live window's mean (failures counted at ERROR_PENALTY_MS, until the
    route has been idle ``latency_failure_idle_sec``), else the history's, else
    ``latency_unprofiled_ttft_ms``; blended with the fast mean, the window weighing
    ``latency_fast_prior_samples`` samples, so that a queue building up or a route dying
    moves the estimate within seconds while a few samples cannot overturn the window.
    Each window keeps at most about ``latency_max_samples_per_profile`` samples, thinned
    evenly over time (``SampleThinner``): memory and the cost of a sample stay bounded at any
    request rate, and the window keeps following the endpoint instead of freezing once full.
    """

    def __init__(self, params: RouteWiseParams) -> None:
        self._params = params
        self._live: dict[str, TtftWindow] = {}
        self._prior: dict[str, TtftWindow] = {}
        self._fast: dict[str, FastMean] = {}
        # endpoint -> a moving mean of how long a successful attempt held its slot (ms);
        # read only outside (``hold_ms``, or the whole map on the hot path)
        self.holds: dict[str, float] = {}
        self.last_seen: dict[str, float] = {}
        # endpoint -> (whole second, (LP latency, profiled)), dropped at its next sample: the
        # hot path reads each estimate once per sample or per second, not once per request.
        # Read only outside (``lp_latency``, or the whole map on the hot path).
        self.lp_cache: dict[str, tuple[int, tuple[float, bool]]] = {}
        # endpoint -> (whole second, its windows' changes, their mean): most samples only move
        # the fast mean (the windows thin them away), so the windows' part of an estimate is
        # read once per kept sample or per second. A sample ageing out of a window is seen at
        # the next second then (as between samples by ``lp_cache``), not at once: windows of
        # minutes, a second's lag.
        self._means: dict[str, tuple[int, int, int, float | None]] = {}

    def retune(self, params: RouteWiseParams) -> None:
        """Read thresholds from ``params`` from now on (windows apply to new endpoints; the
        failures' idle time to every one)."""
        self._params = params
        for window in (*self._live.values(), *self._prior.values()):
            window.failure_idle = params.latency_failure_idle_sec
        self.lp_cache.clear()
        self._means.clear()

    def _windows(self, endpoint: str) -> tuple[TtftWindow, TtftWindow]:
        live = self._live.get(endpoint)
        if live is None:
            p = self._params
            budget = p.latency_max_samples_per_profile
            idle = p.latency_failure_idle_sec
            live = self._live[endpoint] = TtftWindow(p.latency_window_sec, budget, idle)
            self._prior[endpoint] = TtftWindow(p.latency_history_prior_window_sec, budget, idle)
        return live, self._prior[endpoint]

    def success(self, endpoint: str, ttft_ms: float, ts: float) -> None:
        """A first token arrived ``ttft_ms`` after the attempt began, at ``ts``."""
        self.answered(endpoint, ttft_ms, None, ts)

    def answered(
        self, endpoint: str, ttft_ms: float | None, held_ms: float | None, ts: float
    ) -> None:
        """An attempt answered at ``ts``: its first token ``ttft_ms`` after it began (None:
        unknown), and it held its slot ``held_ms`` (first byte to last; None: unknown), what
        a queue there makes the next one wait for, per slot. One call per answer: the hot
        path of every observation."""
        if held_ms is not None and held_ms > 0 and math.isfinite(held_ms):
            mean = self.holds.get(endpoint)
            self.holds[endpoint] = (
                held_ms if mean is None else mean + (held_ms - mean) * _HOLD_ALPHA
            )
        if ttft_ms is None or not math.isfinite(ttft_ms) or ttft_ms < 0:
            return
        live = self._live.get(endpoint)
        if live is None:
            live, prior = self._windows(endpoint)
        else:
            prior = self._prior[endpoint]
        live.success(ts, ttft_ms)
        prior.success(ts, ttft_ms)
        self._add_fast(endpoint, ts, ttft_ms)
        # _touch, inline (once per answer)
        seen = self.last_seen.get(endpoint)
        if seen is None or ts > seen:
            self.last_seen[endpoint] = ts
        self.lp_cache.pop(endpoint, None)

    def hold_ms(self, endpoint: str) -> float | None:
        """The mean time a successful attempt holds a slot on ``endpoint`` (None: unseen)."""
        return self.holds.get(endpoint)

    def _add_fast(self, endpoint: str, ts: float, value: float) -> None:
        half_life = self._params.latency_fast_half_life_sec
        if half_life <= 0:
            return
        fast = self._fast.get(endpoint)
        if fast is None or fast.tau != half_life:
            fast = self._fast[endpoint] = FastMean(half_life)
        fast.add(ts, value)

    def _touch(self, endpoint: str, ts: float) -> None:
        seen = self.last_seen.get(endpoint)
        if seen is None or ts > seen:
            self.last_seen[endpoint] = ts
        self.lp_cache.pop(endpoint, None)

    def failure(self, endpoint: str, kind: str, ts: float) -> None:
        """An attempt failed before its first token (``kind`` is not weighed: every failure
        costs the same penalty)."""
        for window in self._windows(endpoint):
            window.failure(ts)
        self._add_fast(endpoint, ts, ERROR_PENALTY_MS)
        self._touch(endpoint, ts)

    def samples(self, endpoint: str, now: float) -> int:
        """Live-window samples (successes and failures) of ``endpoint``."""
        live = self._live.get(endpoint)
        return 0 if live is None else live.samples(now)

    def profiled(self, endpoint: str, now: float) -> bool:
        """Whether any evidence (live or history) exists for ``endpoint``."""
        return self.estimate(endpoint, now) is not None

    def estimate(self, endpoint: str, now: float) -> float | None:
        """Mean TTFT in ms, or None when nothing was ever measured there."""
        live = self._live.get(endpoint)
        if live is None:
            return None
        prior, second = self._prior[endpoint], int(now)
        hit = self._means.get(endpoint)
        if (
            hit is not None
            and hit[0] == second
            and hit[1] == live.changes
            and hit[2] == prior.changes
        ):
            mean = hit[3]
        else:
            mean = live.mean_with_errors(now)
            if mean is None:
                mean = prior.mean_with_errors(now)
            self._means[endpoint] = (second, live.changes, prior.changes, mean)
        if mean is None:
            return None
        fast = self._fast.get(endpoint)
        if fast is None:
            return mean
        return fast.blend(mean, self._params.latency_fast_prior_samples, now)

    def lp_latency(self, endpoint: str, now: float) -> tuple[float, bool]:
        """(the LP's latency, whether measured) for ``endpoint``, cached until its next
        sample or the next whole second. Within a second the windows' part of it moves only
        with a kept sample (see ``_means``): what leaves a window by age that second counts
        from the next one."""
        second = int(now)
        hit = self.lp_cache.get(endpoint)
        if hit is not None and hit[0] == second:
            return hit[1]
        est = self.estimate(endpoint, now)
        value = (self._params.latency_unprofiled_ttft_ms if est is None else est, est is not None)
        self.lp_cache[endpoint] = (second, value)
        return value

    def objective(self, endpoint: str, now: float) -> float:
        """The LP's latency for ``endpoint``: the estimate, or the unprofiled default."""
        est = self.estimate(endpoint, now)
        return self._params.latency_unprofiled_ttft_ms if est is None else est

    def window(self, endpoint: str) -> TtftWindow | None:
        """The live window (for hedging's CDF queries)."""
        return self._live.get(endpoint)


class OutputLengthPredictor:
    """Predicts completion tokens from the prompt size: the mean of the prompt-size bucket
    (powers of two: 0, 1, 2-3, 4-7, ..., the size's bit length), else of this model's
    observations, else of every row seen (donor models' bootstrap rows included), else
    ``output_default_tokens``; each level needs its minimum samples."""

    def __init__(self, params: RouteWiseParams) -> None:
        self._params = params
        self._buckets: dict[int, tuple[int, float]] = {}
        self._model = (0, 0.0)
        self._global = (0, 0.0)

    def retune(self, params: RouteWiseParams) -> None:
        """Read thresholds from ``params`` from now on."""
        self._params = params

    def update(self, prompt_tokens: int, completion_tokens: int, *, own: bool = True) -> None:
        """Learn one finished request's completion length (``own``: this model's row)."""
        if completion_tokens <= 0:
            return
        n, total = self._global
        self._global = (n + 1, total + completion_tokens)
        if own:
            n, total = self._model
            self._model = (n + 1, total + completion_tokens)
            b = int(prompt_tokens).bit_length() if prompt_tokens > 0 else 0  # its bucket
            n, total = self._buckets.get(b, (0, 0.0))
            self._buckets[b] = (n + 1, total + completion_tokens)

    def predict(self, prompt_tokens: int) -> float:
        """Expected completion tokens for a prompt of ``prompt_tokens``."""
        p = self._params
        bucket = int(prompt_tokens).bit_length() if prompt_tokens > 0 else 0  # its bucket
        n, total = self._buckets.get(bucket, (0, 0.0))
        if n >= p.output_min_bucket_samples:
            return total / n
        for (n, total), need in (
            (self._model, p.output_min_model_samples),
            (self._global, p.output_min_global_samples),
        ):
            if n >= need:
                return total / n
        return p.output_default_tokens


class CostEnvelope:
    """The rolling distribution of what requests cost at on-demand prices.

    Its lower and upper percentiles are the quota shadow price's ``L`` and ``U``. It is
    calibrated once it holds ``envelope_min_samples`` requests within the window and its
    percentiles are positive (the exponential curve needs ``0 < L < U``; a flat envelope is
    widened by a hair so a constant workload still prices quota at ``L``). It keeps about
    ENVELOPE_MAX_SAMPLES per window at most, thinned evenly over time (``SampleThinner``).
    """

    def __init__(self, params: RouteWiseParams) -> None:
        self._params = params
        self._window = params.envelope_window_hours * 3600.0
        self._thinner = SampleThinner(ENVELOPE_MAX_SAMPLES, self._window)
        self._rows: deque[tuple[float, float]] = deque()  # (ts, cost), in arrival order
        self._sorted: list[float] = []
        self._cache: tuple[float, float] | None = None

    def retune(self, params: RouteWiseParams) -> None:
        """Read the percentiles, minimum and window from ``params`` from now on."""
        self._params = params
        if params.envelope_window_hours * 3600.0 != self._window:
            self._window = params.envelope_window_hours * 3600.0
            self._thinner = SampleThinner(ENVELOPE_MAX_SAMPLES, self._window)
        self._cache = None

    def add(self, cost: float, ts: float) -> None:
        """One request's on-demand cost at ``ts``."""
        thinner = self._thinner
        if ts < thinner.due or not math.isfinite(cost) or cost < 0 or not thinner.admit(ts):
            return
        self._rows.append((ts, cost))
        bisect.insort(self._sorted, cost)
        self._cache = None

    def _expire(self, now: float) -> None:
        while self._rows and self._rows[0][0] < now - self._window:
            _, cost = self._rows.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, cost)]
            self._cache = None

    def bounds(self, now: float) -> tuple[float, float] | None:
        """(L, U), or None while not calibrated."""
        self._expire(now)
        if len(self._sorted) < self._params.envelope_min_samples:
            return None
        if self._cache is None:
            lo = _percentile(self._sorted, self._params.envelope_lower_percentile / 100.0)
            hi = _percentile(self._sorted, self._params.envelope_upper_percentile / 100.0)
            if lo <= 0.0:
                positive = [c for c in self._sorted if c > 0.0]
                if not positive:
                    return None
                lo = positive[0]
            self._cache = (lo, max(hi, lo * (1.0 + 1e-6)))
        return self._cache

    def __len__(self) -> int:
        return len(self._sorted)


def _percentile(ordered: list[float], q: float) -> float:
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
