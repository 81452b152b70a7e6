"""LimitsActor: owns every rate limit, concurrency slot and budget of keys, users and orgs.

One actor for all subjects, not one per subject: a request is checked against its key, its
user and its organisation at once, and all three must be taken or none. One owner makes
that one bus round trip and one atomic step (no two-phase lease across actors); a check
costs microseconds, so one actor serves many thousands of requests a second. Sharding, when
one host is not enough, splits by organisation (a key and its user never leave their org).

Serves (see ``schemas/limits.py``): ``llmgw.limits.admit`` (AdmitRequest -> AdmitReply, or
AdmitBatch -> AdmitBatchReply), ``llmgw.limits.settle`` (LimitSettle or LimitSettleBatch ->
AdmitReply once the counters holding it are saved; a request id settled in the last ten
minutes is not counted again), ``.renew`` (event), ``llmgw.limits.get`` (LimitsGet ->
LimitsState, also published on ``llmgw.limits.state`` on every change) and the admin area
``limits``:

- ``get`` {subject? | kind?, id?}: every limit, or one subject's limit and its counters now;
- ``set`` {subject | kind, id, rpm?, tpm?, concurrency?, budget? ("10/month") | budget_usd?,
  budget_period?, soft_fraction?}: replace the subject's limit (a ``key:`` subject must name
  a key the ApiKeyAdminActor knows, asked on ``llmgw.auth.keys.lookup`` off the mailbox, so
  admissions never wait for that answer);
- ``clear`` {subject | kind, id}: remove it (its counters stay until they age out).

Limits are stored in the ``limits`` table at once; counters are snapshotted every
``limits.snapshot_seconds`` while they change and on stop, with the ids of the settles they
hold; a settle is acknowledged only once saved, so its ingress keeps it until then and a
crash loses no settled usage (it loses at most ``snapshot_seconds`` of admissions'
counting). Leases are not snapshotted: a restarted owner counts a request whose lease it
forgot when it settles (its reservation, already in the window snapshot, may then count
twice: the error is on the safe side); one a reload replaces hands them to its successor
(``handing_over``). In a cluster (``state``: the unit's snapshots in JetStream,
``stores.limits_snapshot``) the leases are saved, and admissions and settles are answered
once one save holds them, so a host taking this one over goes on exactly. Publishes
``BudgetThreshold`` on ``llmgw.events.budget`` when a soft threshold or a whole budget is crossed
(once per period), ``LeaseExpired`` on ``llmgw.events.limits`` when its ingress stops renewing one.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from actors.admin import AdminArea, AdminChecked, AdminQuestion, stored
from actors.base import Actor, ActorContext, Serve
from actors.key_check import key_question
from actors.state.limit_counters import (
    Counters,
    Holds,
    Lease,
    admit,
    count_unleased,
    settle,
    settle_lapsed,
)
from actors.state.limit_leases import LeaseBook, LeaseSnapshot, dump_lease, restore_lease
from actors.state.limit_usage import admit_reply, counters_now, subject_usage, usage_report
from actors.stores.db import open_db
from actors.stores.limits import LIMITS, CountersSave, LimitsStorage, SqliteLimits
from actors.stores.limits_snapshot import SnapshotLimits
from schemas import (
    AdminCommand,
    GatewayError,
    subjects,
)
from schemas.limits import (
    SPEC_ARGS,
    SUBJECT_ARGS,
    AdmitBatch,
    AdmitBatchReply,
    AdmitReply,
    AdmitRequest,
    BudgetThreshold,
    LeaseExpired,
    LimitRenew,
    LimitsConfig,
    LimitSettle,
    LimitSettleBatch,
    LimitsGet,
    LimitSpec,
    LimitsState,
    spec_arg,
    subject_arg,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.stores.snapshots import SnapshotStore
    from bus import Envelope

logger = logging.getLogger(__name__)

_QUEUE = "limits"
_HANDED_OVER: dict[str, list[LeaseSnapshot]] = {}  # by database: a successor's leases
_SETTLED_KEEP_S = 600.0  # an ingress sends an unacknowledged settle again within seconds
_SETTLED_MAX = 500_000
_LAPSED_MAX = 10_000  # an ingress keeps at most as many settles it owes (OWED_MAX)
_BUDGET_EVENT = subjects.event("budget")
_LIMITS_EVENT = subjects.event("limits")


@dataclass(frozen=True, slots=True)
class _Sweep:
    """Local timer: release expired leases."""


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """Local timer: save changed counters."""


@dataclass(frozen=True, slots=True)
class _Flush:
    """Save what admissions and settles changed, then answer them (a cluster's owner)."""


class LimitsActor(Actor):
    """Owns the ``limits`` tables and every counter. A storage failure refuses the admin
    command (GatewayError); admission never waits for storage on one host. With ``state``
    (a cluster: the unit's snapshots in JetStream, see ``stores.limits_snapshot``) the
    limits, counters and leases live there instead of the SQLite file, and an admission is
    answered once saved, so the host taking this one over holds every limit exactly."""

    def __init__(
        self,
        db_path: str,
        settings: LimitsConfig,
        *,
        clock: Callable[[], float] = time.time,
        state: SnapshotStore | None = None,
    ) -> None:
        self.name = "limits"
        self._path = db_path
        self._shared = state
        self._settings = settings
        self._clock = clock
        self.admin = AdminArea(
            "limits",
            {"get": self._get, "set": self._set, "clear": self._clear, "usage": self._usage},
            checks={"get": self._check_get, "set": self._check_set},
            args={"get": SUBJECT_ARGS, "set": SUBJECT_ARGS | SPEC_ARGS, "clear": SUBJECT_ARGS},
        )
        self.serves = (
            Serve(subjects.LIMITS_ADMIT, queue=_QUEUE),
            Serve(subjects.LIMITS_SETTLE, queue=_QUEUE),
            Serve(subjects.LIMITS_RENEW, queue=_QUEUE),
            Serve(subjects.LIMITS_GET, queue=_QUEUE),
            self.admin.serve,
        )

    async def on_start(self, ctx: ActorContext) -> None:
        """Load the limits and the last counters, publish the limits, start the timers."""
        self.ctx = ctx
        self._storage: LimitsStorage = (
            SqliteLimits(await open_db(self._path, [LIMITS]))
            if self._shared is None
            else SnapshotLimits(self._shared)
        )
        now = self._clock()
        loaded = await self._storage.load(now - _SETTLED_KEEP_S)
        self._specs = loaded.specs
        self._counters = {s: Counters.restore(snap, now) for s, snap in loaded.counters.items()}
        self._leases = LeaseBook()
        for snap in loaded.leases or _HANDED_OVER.get(self._path, []):
            self._leases.add(restore_lease(snap, self._counter))
        self._dirty: set[str] = set()
        self._leases_dirty = False  # admitted, settled, renewed or expired since the save
        self._expired: list[LeaseExpired] = []
        # Request ids settled lately (insertion order is time order), so that a settle its
        # ingress sent again counts once; kept _SETTLED_KEEP_S, at most _SETTLED_MAX of them.
        self._settled: OrderedDict[str, float] = OrderedDict(loaded.settled)
        # Leases expired lately (as _settled): a settle that comes after all replaces the
        # reservation they were counted at, instead of being counted on top of it.
        self._lapsed: OrderedDict[str, tuple[Lease, float]] = OrderedDict()
        self._unsaved_settled: list[tuple[str, float]] = []
        self._acks: list[Envelope] = []  # settles counted, to acknowledge once saved
        # Verdicts to answer once a save holds what they took (when leases are saved).
        self._held: list[tuple[Envelope, AdmitReply | AdmitBatchReply]] = []
        self._flushing = False  # a _Flush is queued
        await self._publish_state()
        _HANDED_OVER.pop(self._path, None)  # once started: a failed start leaves them for the next
        ctx.call_later(self._settings.lease_ttl_seconds / 2, _Sweep())
        ctx.call_later(self._settings.snapshot_seconds, _Snapshot())

    async def on_stop(self) -> None:
        """Save the counters (hand the leases to a successor) and close the database."""
        if self.handing_over and self._shared is None:  # (a cluster's are saved)
            _HANDED_OVER[self._path] = [dump_lease(lease) for lease in self._leases.leases()]
        try:
            await self._save()
        finally:
            await self._storage.aclose()

    async def handle(self, env: Envelope) -> None:
        """Admission, settles, renewals, the limits' view and the admin area."""
        match env.message:
            case AdmitRequest() as req:
                await self._verdict(env, self._admit(req))
            case AdmitBatch() as batch:
                replies = tuple(map(self._admit, batch.requests))
                await self._verdict(env, AdmitBatchReply(replies=replies))
            # Settles are requests: counted at once, acknowledged once the counters holding
            # them are saved (the ingress keeps a settle until then, and sends it again).
            case LimitSettle() as done:
                await self._settle(done)
                self._acks.append(env)
                await self._flush_soon()
            case LimitSettleBatch() as settles:
                for done in settles.settles:
                    await self._settle(done)
                self._acks.append(env)
                await self._flush_soon()
            case LimitRenew() as renew:
                expires = self._clock() + self._settings.lease_ttl_seconds
                if self._leases.renew(renew.request_ids, expires):
                    self._leases_dirty = True  # saved with the next snapshot
            case LimitsGet():
                await env.respond(self._state())
            case _ if self.admin.owns(env):
                await self.admin.answer(self.ctx, env)

    async def handle_local(self, msg: object) -> None:
        """The lease sweep, the snapshot timer and the admin commands whose key was checked."""
        if isinstance(msg, _Sweep):
            self._expire(self._clock())
            self._forget_settled(self._clock())
            self.ctx.call_later(self._settings.lease_ttl_seconds / 2, _Sweep())
        elif isinstance(msg, _Snapshot):
            await self._save()
            self.ctx.call_later(self._settings.snapshot_seconds, _Snapshot())
        elif isinstance(msg, _Flush):
            self._flushing = False
            await self._save()
        elif isinstance(msg, AdminChecked):
            await self.admin.resume(self.ctx, msg)

    async def _verdict(self, env: Envelope, reply: AdmitReply | AdmitBatchReply) -> None:
        """Answer an admission: at once, or (when leases are saved) once a lease it may
        have taken is saved, with every other verdict given meanwhile (one save for all)."""
        if self._storage.saves_leases and self._leases_dirty:
            self._held.append((env, reply))
            await self._flush_soon()
        else:
            await env.respond(reply)

    async def _flush_soon(self) -> None:
        """Queue one save behind what the mailbox holds now (when leases are saved)."""
        if self._storage.saves_leases and not self._flushing:
            self._flushing = True
            await self.ctx.send_self(_Flush())

    # -- counting -----------------------------------------------------------------------

    def _holds(self, subjects_: tuple[str, ...], role: str) -> list[tuple[str, LimitSpec]]:
        """The (counter subject, spec) pairs that apply: a key without a limit of its own
        takes its role's default, counted on the key's own counters."""
        out = []
        for s in subjects_:
            spec = self._specs.get(s)
            if spec is None and role and s.startswith("key:"):
                spec = self._specs.get(f"role:{role}")
            if spec is not None:
                out.append((s, spec))
        return out

    def _counter(self, subject: str) -> Counters:
        c = self._counters.get(subject)
        if c is None:
            c = self._counters[subject] = Counters()
        return c

    def _admit(self, req: AdmitRequest) -> AdmitReply:
        tokens, cost = _bounded(req.tokens, req.cost_usd)
        now = self._clock()
        self._expire(now)
        holds = self._holds(req.subjects, req.role)
        if not holds:
            return AdmitReply(admitted=True)
        pairs = [(s, spec, self._counter(s)) for s, spec in holds]
        verdict = admit(
            pairs,
            req.request_id,
            req.ingress,
            tokens,
            cost,
            now,
            self._settings.lease_ttl_seconds,
        )
        if isinstance(verdict, Lease):
            self._leases.add(verdict)
            self._dirty.update(s for s, _ in holds)
            self._leases_dirty = True
            return admit_reply(pairs, now, None)
        return admit_reply(pairs, now, verdict)

    async def _settle(self, done: LimitSettle) -> None:
        tokens, cost = _bounded(done.tokens, done.cost_usd)
        now = self._clock()
        if done.request_id in self._settled:
            return  # sent again: its answer was lost, or it was owed and sent twice
        self._settled[done.request_id] = now
        self._unsaved_settled.append((done.request_id, now))
        lease = self._leases.pop(done.request_id)
        lapsed = self._lapsed.pop(done.request_id, None) if lease is None else None
        if lease is not None:
            self._leases_dirty = True
            settle(lease, tokens, cost, now)
            touched: Holds = [(h.subject, h.spec, h.counters) for h in lease.holds]
        elif lapsed is not None:
            settle_lapsed(lapsed[0], tokens, cost, lapsed[1], now)
            touched = [(h.subject, h.spec, h.counters) for h in lapsed[0].holds]
        else:
            touched = [
                (s, spec, self._counter(s)) for s, spec in self._holds(done.subjects, done.role)
            ]
            count_unleased(touched, tokens, cost, now, request=done.unadmitted)
        for subject, spec, c in touched:
            self._dirty.add(subject)
            await self._budget_events(subject, spec, c, now)

    def _forget_settled(self, now: float) -> None:
        cutoff = now - _SETTLED_KEEP_S
        lapsed = self._lapsed
        while lapsed and (len(lapsed) > _LAPSED_MAX or next(iter(lapsed.values()))[1] <= cutoff):
            lapsed.popitem(last=False)
        settled = self._settled
        while settled:
            rid, when = settled.popitem(last=False)
            if when > cutoff and len(settled) < _SETTLED_MAX:
                settled[rid] = when
                settled.move_to_end(rid, last=False)
                return

    def _expire(self, now: float) -> None:
        """Settle every lease whose ingress stopped renewing it, at its reservation, and
        announce it (``LeaseExpired`` on ``llmgw.events.limits``)."""
        for lease in self._leases.expired(now):
            self._leases_dirty = True
            self._dirty.update(h.subject for h in lease.holds)
            logger.info("limits: lease of %s (ingress %s) expired", lease.request_id, lease.ingress)
            settle(lease, lease.tokens, lease.cost_usd, now)
            self._lapsed[lease.request_id] = (lease, now)
            self._expired.append(
                LeaseExpired(
                    request_id=lease.request_id,
                    ingress=lease.ingress,
                    subjects=tuple(h.subject for h in lease.holds),
                    ts=now,
                )
            )
        if self._expired:
            self.ctx.start_soon(self._announce_expired)

    async def _announce_expired(self) -> None:
        expired, self._expired = self._expired, []
        for event in expired:
            try:
                await self.ctx.publish(_LIMITS_EVENT, event)
            except GatewayError as exc:
                logger.warning("limits: expiry event not published: %s", exc)

    async def _budget_events(self, subject: str, spec: LimitSpec, c: Counters, now: float) -> None:
        budget = spec.budget_usd
        if budget is None:
            return
        for exhausted in c.budget_crossings(spec, now):
            event = BudgetThreshold(
                subject=subject,
                period=c.period,
                spent_usd=c.spent_usd,
                budget_usd=budget,
                exhausted=exhausted,
                ts=now,
            )
            try:
                await self.ctx.publish(_BUDGET_EVENT, event)
            except GatewayError as exc:
                logger.warning("limits: budget event not published: %s", exc)

    async def _save(self) -> None:
        """Save the changed counters with the ids of the settles they hold (and, where kept,
        the leases), then acknowledge those settles and answer the verdicts held for it (a
        failed save keeps them unanswered: their ingresses send settles again and time the
        admissions out, and the next save retries)."""
        leases_dirty = self._leases_dirty and self._storage.saves_leases
        if self._dirty or self._unsaved_settled or leases_dirty:
            snaps = {s: self._counters[s].snapshot() for s in self._dirty if s in self._counters}
            settled, self._unsaved_settled = self._unsaved_settled, []
            leases = (
                [dump_lease(lease) for lease in self._leases.leases()] if leases_dirty else None
            )
            self._dirty, self._leases_dirty = set(), False
            now = self._clock()
            try:
                batch = CountersSave(snaps, now, settled, now - _SETTLED_KEEP_S, leases)
                await self._storage.save_counters(batch)
            except Exception as exc:  # the next change retries; counting goes on in memory
                logger.error("limits: saving counters failed: %s", exc)
                self._dirty.update(snaps)
                self._unsaved_settled[:0] = settled
                self._leases_dirty = self._leases_dirty or leases_dirty
                return
        acks, self._acks = self._acks, []
        answers: list[tuple[Envelope, AdmitReply | AdmitBatchReply]]
        answers = [(env, AdmitReply(admitted=True)) for env in acks]
        answers += self._held
        self._held = []
        for env, reply in answers:
            try:
                await env.respond(reply)
            except GatewayError as exc:  # a settle's ingress sends it again; counted once
                logger.info("limits: answer not delivered: %s", exc)

    # -- the view and the admin area ----------------------------------------------------

    def _state(self) -> LimitsState:
        return LimitsState(limits=dict(self._specs), ts=self._clock())

    async def _publish_state(self) -> None:
        try:
            await self.ctx.publish(subjects.LIMITS_STATE, self._state())
        except GatewayError as exc:
            logger.warning("limits: state not published: %s", exc)

    async def _get(self, cmd: AdminCommand) -> dict[str, Any]:
        if "subject" not in cmd.args and "kind" not in cmd.args:
            return {
                "limits": {s: msgspec.to_builtins(spec) for s, spec in sorted(self._specs.items())}
            }
        subject = subject_arg(cmd.args)
        spec = self._specs.get(subject)
        now = self._clock()
        c = self._counters.get(subject)
        if c is not None and spec is not None and spec.budget_usd is not None:
            c.roll(spec, now)
        return {
            "subject": subject,
            "limit": msgspec.to_builtins(spec) if spec else None,
            "usage": counters_now(c, now),
        }

    async def _usage(self, cmd: AdminCommand) -> dict[str, Any]:
        """Every subject with a limit of its own, how close it is (``limit_usage``)."""
        now = self._clock()
        rows = []
        for subject, spec in self._specs.items():
            c = self._counters.get(subject)
            if c is not None and spec.budget_usd is not None:
                c.roll(spec, now)
            rows.append(subject_usage(subject, spec, c, now))
        return usage_report(rows)

    async def _set(self, cmd: AdminCommand) -> dict[str, Any]:
        subject = subject_arg(cmd.args)
        spec = spec_arg(cmd.args)
        await stored(self._storage.save_limit(subject, spec, self._clock()), "limits")
        self._specs[subject] = spec
        await self._publish_state()
        return {"subject": subject, "limit": msgspec.to_builtins(spec)}

    def _check_get(self, cmd: AdminCommand) -> AdminQuestion | None:
        """Ask whether a key with neither a limit nor counters exists (zero usage of a key
        that does not exist would read as a real key's, idle). Raises InvalidRequestError."""
        if "subject" not in cmd.args and "kind" not in cmd.args:
            return None
        subject = subject_arg(cmd.args)
        if self._specs.get(subject) is not None or self._counters.get(subject) is not None:
            return None
        return key_question(self.ctx.bus, subject)

    def _check_set(self, cmd: AdminCommand) -> AdminQuestion | None:
        """Ask whether a ``key:`` subject's key exists, once the arguments are valid.
        Raises InvalidRequestError."""
        subject = subject_arg(cmd.args)
        spec_arg(cmd.args)
        return key_question(self.ctx.bus, subject)

    async def _clear(self, cmd: AdminCommand) -> dict[str, Any]:
        subject = subject_arg(cmd.args)
        await stored(self._storage.save_limit(subject, None, self._clock()), "limits")
        existed = self._specs.pop(subject, None) is not None
        await self._publish_state()
        return {"subject": subject, "cleared": existed}


_MOST_TOKENS = 2**53  # past every limit (MAX_COUNT), and exact as a float
_MOST_USD = 1e15  # past every budget (MAX_BUDGET_USD)


def _bounded(tokens: int, cost_usd: float) -> tuple[int, float]:
    """A message's amounts as the counters can hold them: a count too large for a float
    (a caller's 400-digit ``max_tokens``) crashed the actor. One past every limit stays past
    it; a negative one, which would pay spend back, counts nothing."""
    if not 0.0 <= cost_usd <= _MOST_USD:  # NaN too (max() would keep it)
        cost_usd = _MOST_USD if cost_usd > _MOST_USD else 0.0
    return min(max(tokens, 0), _MOST_TOKENS), cost_usd
