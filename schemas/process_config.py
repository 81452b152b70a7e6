"""The process's own settings in the YAML configuration (where it listens, which bus, the
cluster, the database, the request log, events, metrics, telemetry, the dashboard), as
pydantic models that forbid unknown keys; ``schemas.config`` gathers them into the file's
``GatewayConfig``."""

from __future__ import annotations

import functools
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from schemas.names import has_unprintable

MAX_UPSTREAM_ANSWER_BYTES = 256 * 1024 * 1024
"""The default of ``server.max_upstream_answer_bytes``. The largest legitimate whole answer
is an embeddings answer: 2048 inputs (OpenAI's most per request) of 3072 floats as JSON is
about 130 MB written compactly, about 195 MB as OpenAI writes it (a float per indented
line); chat answers are at most a few MiB."""
MAX_BUSY_POLL_US = 10_000
"""The most ``server.busy_poll_us`` may be: a longer window is spinning, not polling."""


def _printable(value: str) -> str:
    if has_unprintable(value):
        # Never quoting it: it may be a secret.
        raise ValueError("must not contain control characters or line separators")
    return value


Printable = Annotated[str, AfterValidator(_printable)]
"""Text that goes into headers, log lines or ids: no control character, line separator or
bidi override (a key with a line break made every request a 500; an id with one split the
log's lines)."""
FilledPrintable = Annotated[str, Field(min_length=1), AfterValidator(_printable)]
""":data:`Printable`, and not empty."""


def _takes_a_number(annotation: Any) -> bool:
    """Whether a field of type ``annotation`` takes an int or a float and never a bool."""
    if get_origin(annotation) is Annotated:
        return _takes_a_number(get_args(annotation)[0])
    members = (
        get_args(annotation)
        if get_origin(annotation) in (Union, types.UnionType)
        else (annotation,)
    )
    if bool in members:
        return False
    return any(m in (int, float) or _takes_a_number_member(m) for m in members)


def _takes_a_number_member(member: Any) -> bool:
    return get_origin(member) is Annotated and _takes_a_number(member)


@functools.cache
def _number_keys(model: type[BaseModel]) -> tuple[str, ...]:
    """The keys of ``model``'s fields that take a number (a field's alias when it has one)."""
    return tuple(
        field.alias or name
        for name, field in model.model_fields.items()
        if _takes_a_number(field.annotation)
    )


class Strict(BaseModel):
    """A settings block: unknown keys refused, frozen once read, and a number never given as
    true or false (pydantic reads those as 1 and 0: ``port: true`` listened on port 1, a
    YAML ``max_attempts: yes`` was one attempt)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_not_booleans(cls, data: Any) -> Any:
        # On the block, not its fields: a field validator of every field would be one of a
        # union's discriminator too, which pydantic refuses.
        if isinstance(data, dict):
            for key in _number_keys(cls):
                if type(data.get(key)) is bool:
                    raise ValueError(f"{key} takes a number, not true or false")
        return data


class ServerConfig(Strict):
    """Where the ingress listens and what it accepts."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    # A whole (not streamed) upstream answer's body, as received and as inflated: past it
    # the attempt is the upstream's bad response (502, the next route tried), never read on.
    max_upstream_answer_bytes: int = Field(default=MAX_UPSTREAM_ANSWER_BYTES, gt=0)
    # The whole body must arrive this long after the request's head (a stalled or
    # trickling upload would otherwise hold its connection open indefinitely).
    body_timeout_seconds: float = Field(default=30.0, gt=0)
    # The request's head must arrive this long after its first byte (else 408 and close;
    # Hypercorn alone holds a stalled head until its keep-alive timeout, then closes silently).
    header_timeout_seconds: float = Field(default=10.0, gt=0)
    # The HTTP server under the ASGI app: builtin (the default: the gateway's own HTTP/1.1
    # server, HTTP/2 handed to Hypercorn's, every framing defence, fastest), hypercorn (the
    # same defences and HTTP/2, all in Hypercorn) or granian (needs the `granian` extra; no
    # stalled-head timeout, see the README).
    engine: Literal["hypercorn", "granian", "builtin"] = "builtin"
    # Microseconds the event loop keeps polling, not sleeping, after each write to a client or
    # an upstream (0: off). Lower latency at low load on VMs that halt idle vCPUs, for CPU
    # spent polling: gateway/http/busy_poll.py, README "Busy polling".
    busy_poll_us: int = Field(default=0, ge=0, le=MAX_BUSY_POLL_US)


class BusConfig(Strict):
    """Which bus the process joins: ``inproc://`` (embedded) or ``nats://host:port``.

    ``inbox_prefix`` (NATS only): where replies to this process's requests arrive; by default
    ``_INBOX_<user>`` for the user of ``url`` (``_INBOX`` with no user or a token), so the
    NATS permissions can let each user subscribe to its own inbox only. Read by ``llmgw
    serve``; the operator CLIs follow their URL's user.
    """

    url: str = "inproc://"
    inbox_prefix: str | None = Field(default=None, pattern=r"^_INBOX[A-Za-z0-9_-]*$")

    @field_validator("url")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if not (v.startswith(("inproc://", "nats://"))):
            raise ValueError("bus url must start with inproc:// or nats://")
        return v


class ClusterConfig(Strict):
    """Several ``--role actors`` hosts sharing the actors on one NATS cluster (JetStream).

    With ``enabled`` (and a ``nats://`` bus) each actors host heartbeats into the key-value
    bucket ``llmgw_hosts`` every ``heartbeat_seconds``; a host whose key was not refreshed for
    ``ttl_seconds`` is gone. The tree's top-level children are placed over the live hosts by
    rendezvous hashing, each owned under a fencing revision (bucket ``llmgw_owners``), their
    snapshots kept in ``llmgw_snapshots``; every bucket (and the events stream) has
    ``replicas`` copies, by default as many as the cluster allows up to 3 (R3 on three or more
    servers, R1 on one). Off: one actors host owns everything, snapshots in SQLite.

    ``ttl_seconds - heartbeat_seconds`` is how long a host keeps running its units without
    reaching JetStream (then it stops them, before another host may take them over): it must
    outlast the leader election of a replicated bucket after a NATS server dies (2-7 s
    measured; NATS's Raft election timeout is 4-9 s), or losing one NATS node stops units.
    It bounds the takeover of a host that lives but is cut off; a dead host (no process
    answers for it over core NATS) is taken over sooner, after ``2 * heartbeat_seconds +
    0.5`` s or 2.5 s, whichever is longer (``actors.cluster.liveness``).
    """

    enabled: bool = False
    heartbeat_seconds: float = Field(default=1.0, gt=0)
    ttl_seconds: float = Field(default=12.0, gt=0)
    replicas: int | None = Field(default=None, ge=1, le=5)

    def replicas_on(self, servers: int) -> int:
        """The copies each bucket and stream keeps on a cluster of ``servers``: ``replicas``
        when set, else as many as the cluster allows up to 3."""
        return self.replicas if self.replicas is not None else max(1, min(3, servers))

    @model_validator(mode="after")
    def _ttl_spans_beats(self) -> ClusterConfig:
        if self.ttl_seconds < 2 * self.heartbeat_seconds:
            raise ValueError("cluster.ttl_seconds must be at least twice heartbeat_seconds")
        return self


class DatabaseConfig(Strict):
    """The SQLite database (WAL) holding keys, request logs and state that outlives a restart.

    ``url`` (``postgresql://user:password@host:port/db``, or ``LLMGW_DATABASE_URL``): the
    request log and the spend aggregates live in that PostgreSQL database instead of the
    SQLite file, where every actor host can reach them, and so do, in a cluster, the provider
    keys added through the admin API (they move with a takeover); everything else stays in
    ``path``.
    Never printed with its password (``repr`` leaves it out; logs show it redacted).
    """

    path: str = Field(default="llmgw.sqlite3", min_length=1)
    url: str | None = Field(default=None, repr=False)

    @field_validator("url")
    @classmethod
    def _postgres(cls, v: str | None) -> str | None:
        if v and not v.startswith(("postgresql://", "postgres://")):
            raise ValueError("database.url must start with postgresql:// (or postgres://)")
        return v or None


class LogConfig(Strict):
    """The request log (StoreActor, in the database): batching, its bounded queues, retention.

    Each ingress keeps its rows until the store acknowledges them committed, sending at most
    ``batch_rows`` rows a batch; the store commits what arrived within the lesser of
    ``flush_ms`` and 50 ms (group commit), and a batch not acknowledged within ``flush_ms`` +
    5 s is sent again. At most ``queue_rows`` rows wait at an ingress (past that, a request's
    rows are dropped and logged, never waited for) and at the store (past that, a batch is
    refused and sent again).
    A crash of the store loses no row; a clean shutdown loses none.
    """

    enabled: bool = True
    batch_rows: int = Field(default=256, ge=1)
    flush_ms: int = Field(default=250, ge=1)
    queue_rows: int = Field(default=10_000, ge=1)
    retention_days: float = Field(default=30.0, gt=0)

    @model_validator(mode="after")
    def _queue_holds_a_batch(self) -> LogConfig:
        if self.queue_rows < self.batch_rows:
            raise ValueError("queue_rows must be at least batch_rows")
        return self


class EventsConfig(Strict):
    """Operator events (``llmgw.events.<kind>``).

    ``decisions`` publishes a ``decision`` event per request (one more bus message per
    request). On NATS, ``stream`` keeps the events in the JetStream stream ``LLMGW_EVENTS``,
    bounded by ``stream_max_age_seconds`` and ``stream_max_msgs``, so a consumer that was away
    can catch up (``llmgw events --since``). ``stream_max_msgs_per_kind`` bounds each kind
    apart: a busy gateway's one ``decision`` per request would otherwise push every rarer
    event (a circuit, a bench, a reload) out of the stream within a minute.
    """

    decisions: bool = True
    stream: bool = True
    stream_max_age_seconds: float = Field(default=86_400.0, gt=0)
    stream_max_msgs: int = Field(default=100_000, ge=1)
    stream_max_msgs_per_kind: int = Field(default=10_000, ge=1)


class MetricsConfig(Strict):
    """``GET /metrics``: with auth on it needs an ``internal`` or ``admin`` key (the metrics
    name every model, hidden ones too); ``public`` opens it to scrapers without credentials."""

    public: bool = False


class TelemetryConfig(Strict):
    """OpenTelemetry (``gateway.telemetry``): traces and GenAI metrics over OTLP/HTTP.

    Off by default; ``enabled: true`` plus ``OTEL_EXPORTER_OTLP_ENDPOINT`` turns it on (the
    SDK's other ``OTEL_*`` variables are honoured: headers, resource attributes, batch
    schedule, ``OTEL_TRACES_SAMPLER``/``_ARG`` when ``sampler_ratio`` is unset). Needs the
    ``telemetry`` extra. ``capture_content`` (or
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``) puts the messages on the
    attempt spans, each value cut to ``capture_max_chars``. Read at start only.
    """

    enabled: bool = False
    service_name: str = "llmgw"
    sampler_ratio: float | None = Field(default=None, ge=0, le=1)
    capture_content: bool = False
    capture_max_chars: int = Field(default=16_384, ge=256, le=1_048_576)
    metrics: bool = True
    metrics_interval_seconds: float = Field(default=60.0, gt=0)


class DashboardConfig(Strict):
    """The operator dashboard at ``/dashboard`` (``gateway.dashboard``).

    A sign-in with an admin key makes a session: an HttpOnly, ``SameSite=Strict`` cookie
    holding a token signed with ``secret`` (HMAC-SHA256) that expires after
    ``session_seconds``. ``secret`` (or ``LLMGW_DASHBOARD_SECRET``) must be the same on every
    ingress of a deployment for a session to hold on all of them; unset, it is derived from the
    bootstrap ``admin_key``, else drawn at random per process (sessions then end on restart).
    """

    enabled: bool = True
    session_seconds: float = Field(default=3600.0, gt=0, le=7 * 86_400)
    secret: str | None = Field(default=None, repr=False)
    # A folder of ``llmgw replay --out`` folders the Replay reports page lists (read-only).
    reports_dir: str | None = None
