"""The request-log rows the outbox (``accounting.LogOutbox``) cannot deliver: those no bus can
carry, and those left when it stops. Off the request's path: nothing here runs while the
store acknowledges the batches.

A row no bus can carry holds a value of the wrong type (an upstream's ``"code": true`` taken
for a status) that no decoder takes. Sent again for ever, its batch held back every row after
it; once a send failed, the outbox asks :func:`carried` for the batch without such rows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bus.codec import CodecError, decode, encode
from schemas import LogAppend

if TYPE_CHECKING:
    from schemas import Observation, RequestCompleted


def carried(batch: LogAppend) -> tuple[LogAppend | None, int]:
    """``batch`` itself when a bus can carry it; else the batch of its rows one can (None
    when none can; same sender and seq: the store could not read that seq), and how many
    rows were left out."""
    if _carried(batch):
        return batch, 0
    requests = tuple(r for r in batch.requests if _carried(_rows(batch, requests=(r,))))
    attempts = tuple(a for a in batch.attempts if _carried(_rows(batch, attempts=(a,))))
    left_out = len(batch.requests) + len(batch.attempts) - len(requests) - len(attempts)
    if not requests and not attempts:
        return None, left_out
    return _rows(batch, requests, attempts), left_out


def _rows(
    batch: LogAppend,
    requests: tuple[RequestCompleted, ...] = (),
    attempts: tuple[Observation, ...] = (),
) -> LogAppend:
    return LogAppend(sender=batch.sender, seq=batch.seq, requests=requests, attempts=attempts)


def _carried(batch: LogAppend) -> bool:
    try:
        decode(encode(batch))
    except CodecError:
        return False
    return True


def lost_at_stop(waiting: int, *, unsent: int) -> str:
    """The log line of a stop that leaves ``waiting`` rows unacknowledged, ``unsent`` of them
    never sent. Rows never sent are lost for sure. A batch sent and not acknowledged is lost
    too unless the store committed it and its answer was what got lost (then it is in the
    log): no one can say which once the store is out of reach."""
    sent = waiting - unsent
    parts = [f"{unsent} never sent: lost"] if unsent else []
    if sent:
        parts.append(f"{sent} sent: lost unless the store committed them before it went")
    return f"request log: {waiting} rows not acknowledged by the store at stop ({'; '.join(parts)})"
