"""The OTLP/HTTP exporters' transport: one persistent ``http.client`` connection.

The SDK's exporters post through ``requests`` by default, whose per-request session work
(merging environment settings, a ``.netrc`` lookup, hooks, adapters) cost more CPU than the
post itself: about 890 µs of the export thread per 200 kB batch here, against about 170 µs
for ``http.client`` on a kept-alive connection. The SDK's own OTLP client still drives this
transport (``_OTLPHTTPClient``): the protobuf body, the headers (``OTEL_EXPORTER_OTLP_*HEADERS``,
its content type and user agent), gzip or deflate, the timeout, and the retries with
exponential backoff and ``Retry-After`` on 429, 502, 503 and 504 (and once at once on a
dropped connection) are the SDK's, unchanged.

TLS settings are read as the SDK reads them (``OTEL_EXPORTER_OTLP[_<SIGNAL>]_CERTIFICATE``,
``..._CLIENT_CERTIFICATE`` and ``..._CLIENT_KEY``). Where this transport would change what
is sent, the SDK's ``requests`` transport is kept (:func:`transport_for` returns None): when
a proxy from the environment (``HTTP(S)_PROXY``, ``NO_PROXY``) applies to the endpoint, or a
credential provider session is configured. ``requests``' ``.netrc`` lookup is not made.
"""

from __future__ import annotations

import http.client
import os
import ssl
import threading
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from opentelemetry.exporter.http.transport._base import BaseHTTPResult, BaseHTTPTransport

if TYPE_CHECKING:
    from collections.abc import Mapping
    from email.message import Message

__all__ = ["ConnectionTransport", "stop_retrying", "transport_for"]

_CONNECTION_ERRORS = (OSError, http.client.HTTPException)  # socket, TLS, a dropped keep-alive


@dataclass(frozen=True, slots=True)
class _Result(BaseHTTPResult):
    body: bytes = b""
    message: Message | None = field(default=None, hash=False, compare=False)

    def content(self) -> bytes:
        return self.body

    def headers(self) -> Mapping[str, str]:
        """The response's headers (looked up without regard to case)."""
        return self.message if self.message is not None else {}  # type: ignore[return-value]


class ConnectionTransport(BaseHTTPTransport):
    """Owns one kept-alive connection to one OTLP endpoint, reopened after an error or a
    response that closes it. ``verify``: verify the server's certificate (True), with a CA
    bundle file (a path), or not at all (False); ``cert``: a client certificate file, or
    (certificate, key) files. Raises ValueError for a URL that is not http(s)."""

    def __init__(
        self, endpoint: str, *, verify: bool | str = True, cert: str | tuple[str, str] | None = None
    ) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) OTLP endpoint: {endpoint!r}")
        self._endpoint = endpoint
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._context: ssl.SSLContext | None = None
        if self._https:
            context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
            if verify is False:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if isinstance(cert, tuple):
                context.load_cert_chain(cert[0], cert[1])
            elif cert:
                context.load_cert_chain(cert)
            self._context = context
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()  # one request at a time on the one connection

    def _connection(self, timeout: float | None) -> http.client.HTTPConnection:
        conn = self._conn
        if conn is None:
            if self._https:
                conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=timeout, context=self._context
                )
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            self._conn = conn
        else:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
        return conn

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        data: bytes | None = None,
    ) -> BaseHTTPResult:
        """Send one request on the connection; an error comes back in the result."""
        parts = urlsplit(url)
        if url != self._endpoint and (parts.hostname, parts.port) != (self._host, self._port):
            return _Result(error=ValueError(f"this transport posts to {self._endpoint} only"))
        if timeout is not None and timeout <= 0:  # a socket timeout of 0 would not block
            return _Result(error=TimeoutError("the export's deadline has passed"))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        with self._lock:
            try:
                conn = self._connection(timeout)
                conn.request(method, target, body=data, headers=headers or {})
                response = conn.getresponse()
                body = response.read()
            except Exception as error:  # the SDK's client decides whether to retry
                self._close()
                return _Result(error=error)
            if response.will_close:
                self._close()
        return _Result(
            status_code=response.status, reason=response.reason, body=body, message=response.msg
        )

    def is_connection_error(self, exception: Exception | None) -> bool:
        return isinstance(exception, _CONNECTION_ERRORS)

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._close()


_Signal = Literal["TRACES", "METRICS"]
_PATHS = {"TRACES": "v1/traces", "METRICS": "v1/metrics"}


def _env(signal: _Signal, name: str) -> str | None:
    return os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_{name}") or os.environ.get(
        f"OTEL_EXPORTER_OTLP_{name}"
    )


def endpoint_of(signal: _Signal) -> str:
    """The signal's endpoint URL as the SDK's exporter resolves it."""
    found = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    if found:
        return found
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
    return f"{base.removesuffix('/')}/{_PATHS[signal]}"


def _proxied(endpoint: str) -> bool:
    """Whether ``requests`` would send to ``endpoint`` through a proxy from the environment."""
    parts = urlsplit(endpoint)
    proxies: dict[str, Any] = urllib.request.getproxies_environment()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    bypass: Any = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]  # untyped
    return not bypass(parts.netloc, proxies)


def transport_for(signal: _Signal) -> ConnectionTransport | None:
    """A transport for the signal's exporter, or None where the SDK's default must stay
    (a proxy applies, a credential provider is set, or the endpoint is not http(s))."""
    if os.environ.get("OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER") or os.environ.get(
        f"OTEL_PYTHON_EXPORTER_OTLP_HTTP_{signal}_CREDENTIAL_PROVIDER"
    ):
        return None
    endpoint = endpoint_of(signal)
    if _proxied(endpoint):
        return None
    verify: bool | str = _env(signal, "CERTIFICATE") or True
    key, certificate = _env(signal, "CLIENT_KEY"), _env(signal, "CLIENT_CERTIFICATE")
    cert = (certificate, key) if certificate and key else certificate
    try:
        return ConnectionTransport(endpoint, verify=verify, cert=cert)
    except ValueError:
        return None


def stop_retrying(exporter: object) -> None:
    """Make ``exporter`` (an SDK OTLP/HTTP exporter) try each export once from now on: a retry
    it is waiting for is abandoned and a failed post is not retried, though the exporter still
    takes exports. Called when the gateway stops, so that a collector that is gone or refusing
    cannot hold the stop for the exporter's whole timeout (10 s by default, once for the export
    in flight and once more for the last one). The SDK's own ``shutdown`` does the same but
    also refuses the last export; its client's shutdown event is what its retry loop checks.
    An exporter without that client is left as it is."""
    client = getattr(exporter, "_client", None)  # the SDK's HTTP client, since 1.4x
    event = getattr(client, "_shutdown_event", None)
    if isinstance(event, threading.Event):
        event.set()
