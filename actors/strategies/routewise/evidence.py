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


class LatencyEvidence:
    """Per-endpoint TTFT profiles: the live window, and the long history as a prior.

    ``estimate`` is the live window's mean (failures counted at ERROR_PENALTY_MS), else the
    history's, else ``latency_unprofiled_ttft_ms``. ``version`` changes with every sample so
    callers can cache what they derived from the estimates.
    """

    def __init__(self, params: RouteWiseParams) -> None:
        self._params = params
        self._live: dict[str, RollingLatencyProfile] = {}
        self._prior: dict[str, RollingLatencyProfile] = {}
        self.last_seen: dict[str, float] = {}
        self.version = 0
        self._versions: dict[str, int] = {}
        # endpoint -> (its version, whole second, LP latency, profiled): the hot path reads
        # each estimate once per sample or per second, not once per request.
        self._cache: dict[str, tuple[int, int, float, bool]] = {}

    def retune(self, params: RouteWiseParams) -> None:
        """Read thresholds from ``params`` from now on."""
        self._params = params
        self._cache.clear()

    def _profiles(self, endpoint: str) -> tuple[RollingLatencyProfile, RollingLatencyProfile]:
        live = self._live.get(endpoint)
        if live is None:
            live = self._live[endpoint] = RollingLatencyProfile(
                window_sec=self._params.latency_window_sec
            )
            self._prior[endpoint] = RollingLatencyProfile(
                window_sec=self._params.latency_history_prior_window_sec
            )
        return live, self._prior[endpoint]

    def success(self, endpoint: str, ttft_ms: float, ts: float) -> None:
        """A first token arrived ``ttft_ms`` after the attempt began, at ``ts``."""
        if not math.isfinite(ttft_ms) or ttft_ms < 0:
            return
        live, prior = self._profiles(endpoint)
        # A full window keeps what it has until old samples age out: memory stays bounded
        # under any rate, and the library's incremental window sums stay consistent.
        cap = self._params.latency_max_samples_per_profile
        for p in (live, prior):
            if len(p.samples) >= cap:
                p.values(ts)  # drops the samples that left the window
            if len(p.samples) < cap:
                p.add_sample(ts, ttft_ms)
        self._touch(endpoint, ts)

    def _touch(self, endpoint: str, ts: float) -> None:
        self.last_seen[endpoint] = max(ts, self.last_seen.get(endpoint, ts))
        self._versions[endpoint] = self._versions.get(endpoint, 0) + 1
        self.version += 1

    def failure(self, endpoint: str, kind: str, ts: float) -> None:
        """An attempt failed before its first token."""
        for p in self._profiles(endpoint):
            p.add_error(ts, kind or "error")
        self._touch(endpoint, ts)

    def samples(self, endpoint: str, now: float) -> int:
        """Live-window samples (successes and failures) of ``endpoint``."""
        live = self._live.get(endpoint)
        return 0 if live is None else live.count(now) + live.error_count(now)

    def profiled(self, endpoint: str, now: float) -> bool:
        """Whether any evidence (live or history) exists for ``endpoint``."""
        return self.estimate(endpoint, now) is not None

    def estimate(self, endpoint: str, now: float) -> float | None:
        """Mean TTFT in ms, or None when nothing was ever measured there."""
        live = self._live.get(endpoint)
        if live is None:
            return None
        for p in (live, self._prior[endpoint]):
            mean = p.mean_with_errors(now, error_penalty_ms=ERROR_PENALTY_MS)
            if mean is not None:
                return mean
        return None

    def lp_latency(self, endpoint: str, now: float) -> tuple[float, bool]:
        """(the LP's latency, whether measured) for ``endpoint``, cached until its next
        sample or the next whole second."""
        version, second = self._versions.get(endpoint, 0), int(now)
        hit = self._cache.get(endpoint)
        if hit is not None and hit[0] == version and hit[1] == second:
            return hit[2], hit[3]
        est = self.estimate(endpoint, now)
        value = (self._params.latency_unprofiled_ttft_ms if est is None else est, est is not None)
        self._cache[endpoint] = (version, second, *value)
        return value

    def objective(self, endpoint: str, now: float) -> float:
        """The LP's latency for ``endpoint``: the estimate, or the unprofiled default."""
        est = self.estimate(endpoint, now)
        return self._params.latency_unprofiled_ttft_ms if est is None else est

    def profile(self, endpoint: str) -> RollingLatencyProfile | None:
        """The live profile (for hedging's CDF queries)."""
        return self._live.get(endpoint)


def _bucket(prompt_tokens: int) -> int:
    return max(0, int(prompt_tokens)).bit_length()  # powers of two: 0, 1, 2-3, 4-7, ...


class OutputLengthPredictor:
    """Predicts completion tokens from the prompt size: the mean of the prompt-size bucket,
    else of this model's observations, else of every row seen (donor models' bootstrap rows
    included), else ``output_default_tokens``; each level needs its minimum samples."""

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
        self._global = _add(self._global, completion_tokens)
        if own:
            self._model = _add(self._model, completion_tokens)
            b = _bucket(prompt_tokens)
            self._buckets[b] = _add(self._buckets.get(b, (0, 0.0)), completion_tokens)

    def predict(self, prompt_tokens: int) -> float:
        """Expected completion tokens for a prompt of ``prompt_tokens``."""
        p = self._params
        n, total = self._buckets.get(_bucket(prompt_tokens), (0, 0.0))
        if n >= p.output_min_bucket_samples:
            return total / n
        for (n, total), need in (
            (self._model, p.output_min_model_samples),
            (self._global, p.output_min_global_samples),
        ):
            if n >= need:
                return total / n
        return p.output_default_tokens


def _add(acc: tuple[int, float], value: float) -> tuple[int, float]:
    return acc[0] + 1, acc[1] + value


class CostEnvelope:
    """The rolling distribution of what requests cost at on-demand prices.

    Its lower and upper percentiles are the quota shadow price's ``L`` and ``U``. It is
    calibrated once it holds ``envelope_min_samples`` requests within the window and its
    percentiles are positive (the exponential curve needs ``0 < L < U``; a flat envelope is
    widened by a hair so a constant workload still prices quota at ``L``).
    """

    def __init__(self, params: RouteWiseParams) -> None:
        self._params = params
        self._window = params.envelope_window_hours * 3600.0
        self._rows: deque[tuple[float, float]] = deque()  # (ts, cost), in arrival order
        self._sorted: list[float] = []
        self._cache: tuple[float, float] | None = None

    def retune(self, params: RouteWiseParams) -> None:
        """Read the percentiles, minimum and window from ``params`` from now on."""
        self._params = params
        self._window = params.envelope_window_hours * 3600.0
        self._cache = None

    def add(self, cost: float, ts: float) -> None:
        """One request's on-demand cost at ``ts``."""
        if not math.isfinite(cost) or cost < 0:
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
