"""Limits on what a gateway API key, a user or an organisation may send and spend.

A limit attaches to a *subject*, written ``<kind>:<id>``:

- ``key:<key id>`` (``k-...``), ``user:<org>/<user>`` (users are scoped by their
  organisation), ``org:<org>``;
- ``role:<role>``: the default of every key of that role that has no limit of its own
  (applied per key: each such key gets its own counters, not one shared pool).

A ``LimitSpec`` holds any of: ``rpm`` (requests in the last 60 s), ``tpm`` (prompt plus
completion tokens in the last 60 s), ``concurrency`` (requests in flight), ``budget_usd`` per
``budget_period`` (``day``, ``week`` (ISO, Monday) or ``month``; calendar, UTC) with an optional
``soft_fraction`` of it that emits a ``BudgetThreshold`` event once per period.

One LimitsActor owns every counter (``actors/limits.py``); the ingress asks it
(``AdmitRequest`` -> ``AdmitReply``) concurrently with the routing request, renews its
leases while requests run (``LimitRenew``) and settles each on completion (``LimitSettle``,
with the usage and cost really spent). Its view of which subjects are limited
(``LimitsState``) lets callers without any limit skip the check altogether.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec
from pydantic import Field

from schemas.errors import InvalidRequestError
from schemas.keys import ROLES, shown
from schemas.process_config import Strict

SUBJECT_KINDS = ("key", "user", "org", "role")
PERIODS = ("day", "week", "month")
# Far past any real limit, and inside what a float holds exactly and an SQLite INTEGER holds.
MAX_COUNT = 10**12
MAX_BUDGET_USD = 1e12
_SUBJECT_ID_MAX = 256
_SUBJECT = re.compile(rf"^(key|user|org|role):[^\s]{{1,{_SUBJECT_ID_MAX}}}$")


def subject_of(kind: str, ident: str) -> str:
    """The subject string of ``kind`` and ``ident``. Raises ValueError for a bad one."""
    text = f"{kind}:{ident}"
    if kind not in SUBJECT_KINDS or not _SUBJECT.match(text):
        raise ValueError(
            f"a limit subject is one of {', '.join(SUBJECT_KINDS)} and an id "
            "without spaces (e.g. key:k-1a2b, user:acme/alice, org:acme, role:pro)"
        )
    org, _, user = ident.partition("/")
    if kind == "user" and not (org and user):
        raise ValueError("a user limit names its organisation too: user:<org>/<user>")
    if kind == "role" and ident not in ROLES:
        # role:Pro was kept, and limited no key: a key's role is one of these, as written.
        raise ValueError(f"a role limit names one of {', '.join(ROLES)}: role:<role>")
    return text


def key_owner_problem(org: str, user: str) -> tuple[str, str] | None:
    """Why a gateway key cannot belong to ``user`` of ``org``: (the argument, the message);
    None when it can. Both must fit the limit subjects that name them (``org:<org>``,
    ``user:<org>/<user>``): no spaces, no ``/`` in the organisation (``user:a/b/c`` would be
    two users' one counter), at most 256 characters together."""
    for name, value in (("org", org), ("user", user)):
        if any(c.isspace() for c in value):
            return name, f"'{name}' must have no spaces: limits name it ({name}:...)"
    if "/" in org:
        return "org", "'org' must have no '/': a user's limits name it user:<org>/<user>"
    if len(org) + 1 + len(user) > _SUBJECT_ID_MAX:
        return "user", f"'org' and 'user' must be at most {_SUBJECT_ID_MAX - 1} characters together"
    return None


def subject_arg(args: dict[str, Any]) -> str:
    """The subject an admin command's ``args`` name (``subject``, or ``kind`` and ``id``).
    Raises InvalidRequestError."""
    raw = args.get("subject")
    if raw is not None and ("kind" in args or "id" in args):
        # PUT /admin/limits/org/acme with {"subject": "org:other"} set org:other's limit.
        raise InvalidRequestError(
            "name the subject once: 'subject', or 'kind' and 'id' (as the path does)",
            param="subject",
        )
    if raw is None:
        kind, ident = args.get("kind"), args.get("id")
        if not isinstance(kind, str) or not isinstance(ident, str):
            raise InvalidRequestError(
                "name the subject: 'subject' (e.g. key:k-1a2b) or "
                "'kind' (key, user, org, role) and 'id'",
                param="subject",
            )
        raw = f"{kind}:{ident}"
    if not isinstance(raw, str):
        raise InvalidRequestError("'subject' must be a string", param="subject")
    kind, _, ident = raw.partition(":")
    try:
        return subject_of(kind, ident)
    except ValueError as exc:
        raise InvalidRequestError(str(exc), param="subject") from None


class LimitSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one subject may do; None: not limited on that axis."""

    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None
    budget_usd: float | None = None
    budget_period: str = "month"
    soft_fraction: float | None = None

    def problems(self) -> list[str]:
        """Why this spec is not valid (empty when it is)."""
        return [text for _, text in self.faults()]

    def faults(self) -> list[tuple[str | None, str]]:
        """Each problem with the field it is about (None: about the spec as a whole)."""
        out: list[tuple[str | None, str]] = []
        for name in ("rpm", "tpm", "concurrency"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 1):
                out.append((name, f"'{name}' must be a positive integer"))
            elif value is not None and value > MAX_COUNT:
                out.append((name, f"'{name}' must be at most {MAX_COUNT}"))
        if self.budget_usd is not None and not 0 < self.budget_usd <= MAX_BUDGET_USD:  # NaN too
            out.append(
                ("budget_usd", f"'budget_usd' must be positive and at most {MAX_BUDGET_USD:.0f}")
            )
        if self.budget_period not in PERIODS:
            out.append(("budget_period", f"'budget_period' must be one of {', '.join(PERIODS)}"))
        if self.soft_fraction is not None and not 0 < self.soft_fraction < 1:
            out.append(("soft_fraction", "'soft_fraction' must be between 0 and 1"))
        if self.rpm is self.tpm is self.concurrency is self.budget_usd is None:
            out.append((None, "a limit needs at least one of rpm, tpm, concurrency, budget_usd"))
        return out


def parse_budget(text: str) -> tuple[float, str]:
    """``10/month`` -> (10.0, "month"). Raises ValueError."""
    amount, _, period = text.partition("/")
    try:
        usd = float(amount.strip().lstrip("$"))
    except ValueError:
        raise ValueError(f"a budget is USD/period, e.g. 10/month, not {text!r}") from None
    period = period.strip() or "month"
    if not 0 < usd <= MAX_BUDGET_USD or period not in PERIODS:  # NaN and infinities too
        raise ValueError(
            f"a budget is a positive USD amount per {'|'.join(PERIODS)}, "
            f"e.g. 10/month, not {text!r}"
        )
    return usd, period


_SPEC_FIELDS = ("rpm", "tpm", "concurrency", "budget_usd", "budget_period", "soft_fraction")
SUBJECT_ARGS = frozenset({"subject", "kind", "id"})
"""The arguments that name a limit's subject (``subject``, or ``kind`` and ``id``)."""
SPEC_ARGS = frozenset({*_SPEC_FIELDS, "budget"})
"""The arguments of a limit (``limits set``), ``budget`` as ``10/month`` included."""


def spec_arg(args: dict[str, Any]) -> LimitSpec:
    """The LimitSpec of ``limits set``'s arguments (``budget`` as ``10/month`` or the
    ``budget_usd``/``budget_period`` pair). Raises InvalidRequestError."""
    values = {k: args[k] for k in _SPEC_FIELDS if args.get(k) is not None}
    budget = args.get("budget")
    if budget is not None:
        if both := [k for k in ("budget_usd", "budget_period") if args.get(k) is not None]:
            # One of them was dropped without a word: the budget set was not the one meant.
            raise InvalidRequestError(
                "give 'budget' (e.g. 10/month) or 'budget_usd' and 'budget_period', not both",
                param=both[0],
            )
        try:
            values["budget_usd"], values["budget_period"] = parse_budget(str(budget))
        except ValueError as exc:
            raise InvalidRequestError(str(exc), param="budget") from None
    try:
        spec = msgspec.convert(values, LimitSpec)
    except msgspec.ValidationError:
        raise _type_error(values) from None
    faults = spec.faults()
    if faults:
        raise InvalidRequestError("; ".join(text for _, text in faults), param=faults[0][0])
    return spec


_EXPECTED = {
    "rpm": "a positive integer",
    "tpm": "a positive integer",
    "concurrency": "a positive integer",
    "budget_usd": "a positive number of USD",
    "budget_period": f"one of {', '.join(PERIODS)}",
    "soft_fraction": "a number between 0 and 1",
}


def _type_error(values: dict[str, Any]) -> InvalidRequestError:
    """The refusal naming the first field of ``values`` whose type a LimitSpec refuses."""
    for name, value in values.items():
        try:
            msgspec.convert({name: value}, LimitSpec)
        except msgspec.ValidationError:
            return InvalidRequestError(
                f"'{name}' must be {_EXPECTED[name]}, not {shown(value)}", param=name
            )
    return InvalidRequestError("bad limit")


class AdmitRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ingress -> LimitsActor: may this request start? ``subjects`` are the caller's
    (key, user, org); ``role`` picks the default for a key without its own limit.
    ``tokens`` and ``cost_usd`` are the reservation (the estimate); ``ingress`` names the
    process that renews the lease."""

    request_id: str
    ingress: str
    subjects: tuple[str, ...]
    role: str = ""
    tokens: int = 0
    cost_usd: float = 0.0


class AdmitReply(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The owner's verdict. Refused: ``code`` is ``rate_limited`` or ``budget_exceeded``,
    ``retry_after`` the seconds until the window admits the request. The header fields
    describe the tightest limited subject (None: that axis is not limited)."""

    admitted: bool
    code: str = ""
    message: str = ""
    retry_after: float | None = None
    limit_requests: int | None = None
    remaining_requests: int | None = None
    reset_requests: float | None = None
    limit_tokens: int | None = None
    remaining_tokens: int | None = None
    reset_tokens: float | None = None


class LimitSettle(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ingress -> LimitsActor: the request ended; replace its reservation by what it used
    (``tokens`` prompt+completion, ``cost_usd``). ``unadmitted``: it was let through without
    the owner's answer (fail open), so the owner also counts the request itself."""

    request_id: str
    subjects: tuple[str, ...] = ()
    role: str = ""
    tokens: int = 0
    cost_usd: float = 0.0
    unadmitted: bool = False


class AdmitBatch(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ingress -> LimitsActor: the admission requests one ingress began in one turn of its
    event loop (answered with AdmitBatchReply, one verdict per request, in order): one
    message and one round trip for many concurrent requests."""

    requests: tuple[AdmitRequest, ...]


class AdmitBatchReply(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The owner's verdicts of an AdmitBatch, in its order."""

    replies: tuple[AdmitReply, ...]


class LimitSettleBatch(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ingress -> LimitsActor: the settles of one turn of the ingress's event loop (an
    event, like LimitSettle; fail-open settles are never batched: each one is acknowledged)."""

    settles: tuple[LimitSettle, ...]


class LimitRenew(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ingress -> LimitsActor: these leases are still running (batched per ingress)."""

    ingress: str
    request_ids: tuple[str, ...]


class LimitsGet(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Anyone -> LimitsActor: the current limits (answered with LimitsState)."""


class LimitsState(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Every limit by subject, published by the owner on every change (the ingress view)."""

    limits: dict[str, LimitSpec] = {}
    ts: float = 0.0


class BudgetThreshold(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """``llmgw.events.budget``: a subject's spend crossed its soft threshold
    (``exhausted`` False) or its whole budget (True) in ``period`` (e.g. ``2026-12``)."""

    subject: str
    period: str
    spent_usd: float
    budget_usd: float
    exhausted: bool = False
    ts: float = 0.0


class LeaseExpired(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """``llmgw.events.limits``: a lease its ingress stopped renewing was released (counted at
    its reservation); ``ingress`` names the process that probably died."""

    request_id: str
    ingress: str
    subjects: tuple[str, ...] = ()
    ts: float = 0.0


class LimitsConfig(Strict):
    """``limits:`` in the config: how the ingress asks the limits' owner.

    ``fail_open``: when the owner does not answer within ``decision_timeout_seconds``, admit
    the request and have it counted when it settles (default: refuse with 503).
    ``default_max_tokens``: the completion part of a reservation when the request sets no
    ``max_tokens``. ``budget_status``: 429 (default) or 402 for an exhausted budget.
    ``lease_ttl_seconds``: a lease not renewed for this long is released (its ingress died).
    ``snapshot_seconds``: how often the owner saves its counters when they changed.
    """

    fail_open: bool = False
    decision_timeout_seconds: float = Field(default=1.0, gt=0)
    default_max_tokens: int = Field(default=1024, ge=0)
    budget_status: Literal[429, 402] = 429
    lease_ttl_seconds: float = Field(default=30.0, gt=0)
    snapshot_seconds: float = Field(default=1.0, gt=0)
