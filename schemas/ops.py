"""Operating the gateway: request summaries, operator events, admin commands.

- ``RequestCompleted`` — one per client request, published by the ingress when the request
  ends (``llmgw.request.<model>.done``); with its attempts' ``Observation``s it is also sent
  to the request log's owner in a ``LogAppend`` batch (``llmgw.log.append``), answered with
  ``LogAppended`` once committed.
- ``RouteDecided`` (``llmgw.events.decision``), ``ConfigChanged`` (``llmgw.events.config``),
  ``AdminExecuted`` (``llmgw.events.admin``) — operator events.
- ``AdminCommand`` -> ``AdminReply`` | ``ErrorReply`` — every admin action, on
  ``llmgw.admin.<area>.<verb>``, answered by the one actor that owns the area's state.

No struct here ever carries a secret: credentials appear only as their ``k-…`` ids.
"""

from __future__ import annotations

from typing import Any

import msgspec

from schemas.routing import Observation, RouteSkip


class RequestCompleted(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """One client request, end to end (its attempts are ``Observation``s).

    ``status`` is the HTTP status the client got (499: the client went away first).
    ``error_kind`` is empty on success, else the error code or upstream failure kind; a
    stream that broke after its headers were sent keeps status 200 with an ``error_kind``.
    ``ttft_ms`` is client-perceived (from the request's arrival), streams only.
    ``cost_usd`` is the sum of its attempts' costs (``cost_estimated``: one of them priced
    the gateway's estimate); ``key_id`` and ``user`` name the caller's gateway key and user.
    ``prompt_tokens``, ``completion_tokens`` and ``cached_tokens`` sum every attempt's priced
    tokens (``schemas.priced_tokens``: the estimate when it reported no usage), as ``cost_usd``
    sums their costs: a failed-over or hedged attempt's tokens were billed too. Each attempt's
    own are on its ``Observation``.
    """

    request_id: str = ""
    ts: float = 0.0
    caller: str = ""
    org: str = ""
    surface: str = "chat"
    requested_model: str = ""
    model: str = ""
    endpoint: str = ""
    credential_id: str = ""
    status: int = 200
    error_kind: str = ""
    fallback: bool = False
    attempts: int = 0
    ttft_ms: float | None = None
    latency_ms: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    stream: bool = False
    cost_usd: float = 0.0
    cost_estimated: bool = False
    key_id: str = ""
    user: str = ""
    trace_id: str = ""


class LogAppend(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ingress -> StoreActor (``llmgw.log.append``, request/reply): request-log rows, which
    the ingress keeps until the store answers ``LogAppended`` (only once they are committed).

    ``sender`` names one ingress process for its lifetime; ``seq`` counts its batches from 1,
    and a sender sends batch ``seq + 1`` only once ``seq`` is acknowledged, so a batch sent
    again (its answer was lost) is recognised and committed once.
    """

    sender: str
    seq: int
    requests: tuple[RequestCompleted, ...] = ()
    attempts: tuple[Observation, ...] = ()


class LogAppended(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The store's answer to ``LogAppend``: batch ``seq`` is committed (``duplicate``: it
    already was, by an earlier copy)."""

    seq: int
    duplicate: bool = False


class RouteDecided(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A routing decision and what became of it, published when its request ends.

    ``reason`` is the plan's (strategy name, ``pin``, ``affinity``, ...) or, when no plan
    could be made, the error code. ``served`` is the endpoint that answered ("" if none);
    ``fallback`` is true when that was not the primary.

    A steered request (``auto``...) also says how: its ``target`` (lower case), the
    ``chain`` or ``axis`` it resolved to, the ``ordering`` (profile, axis or ``priority``),
    the ``chosen`` first model with its ``score``, the ``runner_up`` with its score, and
    whether the primary was an exploration pick. A request a routing rule sent to its
    chain or axis names the ``rule``. ``skipped``: the routes the plan passed over for
    cooling or capacity, each with why (and its learned limit). ``trace_id`` is the
    request's OpenTelemetry trace ("" when telemetry is off).
    """

    request_id: str = ""
    model: str = ""
    requested_model: str = ""
    surface: str = "chat"
    reason: str = ""
    pinned: bool = False
    primary: str = ""
    candidates: tuple[str, ...] = ()
    served: str = ""
    fallback: bool = False
    attempts: int = 0
    status: int = 200
    ts: float = 0.0
    target: str = ""
    chain: str = ""
    axis: str = ""
    ordering: str = ""
    chosen: str = ""
    score: float | None = None
    runner_up: str = ""
    runner_up_score: float | None = None
    explored: bool = False
    rule: str = ""
    skipped: tuple[RouteSkip, ...] = ()  # routes the plan passed over for cooling or capacity
    trace_id: str = ""


class ConfigChanged(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The actor tree switched to a new configuration; every ingress re-reads its own file.

    ``version`` is a hash of the file's text (an ingress whose file differs logs it).
    """

    version: str
    source: str = ""
    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    by: str = ""
    ts: float = 0.0


class AdminCommand(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """An admin action; its area and verb are the subject's last two tokens.

    ``args`` are the verb's JSON arguments; ``by`` says who asked (``cli``, ``http``,
    ``sighup``, ``dashboard:<admin key id>``), for the audit event; ``request_id`` names the
    exchange that sent it (over HTTP, its answer's ``x-request-id``), for the audit event too.
    """

    args: dict[str, Any] = {}
    by: str = ""
    request_id: str = ""


class AdminReply(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A successful admin command's result (failures are ``ErrorReply``)."""

    result: dict[str, Any] = {}
    message: str = ""


class HostAlive(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """An actors host asking another whether its process lives (``node``: the asker), and
    the answer (``node``: the one answering); core NATS only, see ``actors.cluster``."""

    node: str = ""


class AdminExecuted(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Audit: an admin command that changes state was executed (or refused).

    Never carries the command's arguments, which may hold secrets.
    """

    area: str
    verb: str
    by: str = ""
    ok: bool = True
    message: str = ""
    ts: float = 0.0
    request_id: str = ""
    """The command's ``request_id``: over HTTP, the ``x-request-id`` of the answer to it."""
