"""``x-llmgw-overhead-ms``: a request's elapsed time minus the time an upstream attempt was in
flight, overlapping attempts (a hedge race) counted once; on an injected ``now``."""

from __future__ import annotations

from gateway.ingress.accounting import RequestRecord


def test_overhead_subtracts_sequential_attempts() -> None:
    rec = RequestRecord(started=100.0)
    rec.upstream(100.5, 102.0)  # a failed first hop
    rec.upstream(102.25, 103.0)  # the fallback that served
    assert rec.overhead_header(now=103.5) == (b"x-llmgw-overhead-ms", b"1250.000")


def test_overhead_counts_overlapping_hedge_attempts_once() -> None:
    rec = RequestRecord(started=10.0)
    rec.upstream(10.125, 11.0)  # the backup answered first
    rec.upstream(10.0625, 11.0)  # the primary, declined as the backup won
    rec.upstream(10.125, 10.5)  # a stream's first chunk, noted before its end
    assert rec.upstream_s == 0.9375
    assert rec.overhead_header(now=11.25) == (b"x-llmgw-overhead-ms", b"312.500")


def test_overhead_is_never_negative() -> None:
    rec = RequestRecord(started=0.0)
    rec.upstream(0.0, 2.0)
    assert rec.overhead_header(now=1.0) == (b"x-llmgw-overhead-ms", b"0.000")
