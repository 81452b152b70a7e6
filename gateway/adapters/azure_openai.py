"""``azure_openai`` upstreams: Azure OpenAI deployments.

The wire is OpenAI's, so the ``openai_compat`` adapter does the work; this one says where
and how: ``{base_url}/openai/deployments/{deployment}/chat/completions?api-version=...``
(and ``/embeddings``), the key in ``api-key`` or an Entra ID bearer token from the route's
token command (which this adapter redacts from whatever the upstream says, bare or
``Bearer``: ``RedactingAdapter`` knows only the route key). Azure's own answers are
classified here: a prompt its content filter refused
(a 400 with ``code: content_filter``) is a :class:`~schemas.ContentFilteredError`; a 429
carries ``retry-after`` or ``retry-after-ms``; a quota exhaustion mutes the key. A completion
the filter cut keeps ``finish_reason: content_filter`` and passes through as an answer.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import TYPE_CHECKING
from urllib.parse import quote

from gateway.adapters.base import MappedBatches, error_from_status, redacted
from gateway.adapters.openai_compat import OpenAICompatAdapter
from gateway.adapters.platform_errors import CONTENT_FILTER
from gateway.adapters.upstream_status import error_object, meters_rate
from schemas import QUOTA_EXHAUSTED, RATE_LIMIT_EXCEEDED, ContentFilteredError, UpstreamError
from schemas.config import AzureSettings

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

    from gateway.adapters.base import JSON, Batch, UpstreamTarget
    from gateway.adapters.upstream_http import UpstreamHTTP

_QUOTA_CODES = frozenset({"insufficient_quota", "QuotaExceeded", "OutOfQuota"})
_QUOTA_MARKERS = (b"out of call volume quota", b"insufficient_quota", b"billing")
_TOKEN_COMMAND_TIMEOUT = 30.0
_DEFAULTS = AzureSettings()  # a route without azure: (frozen)


class EntraTokens:
    """Owns the Entra ID tokens the routes' ``entra_token_command`` print: one per command,
    reused for its TTL, fetched by one caller at a time. The tokens are secrets: never logged.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tokens: dict[tuple[str, ...], tuple[str, float]] = {}
        self._previous: dict[tuple[str, ...], str] = {}
        self._lock = asyncio.Lock()

    def sent(self, command: tuple[str, ...]) -> tuple[str, ...]:
        """The tokens an attempt with ``command`` may have sent: the current one and the one
        it replaced (an attempt that began before a refresh still carries the old one)."""
        held = self._tokens.get(command)
        previous = self._previous.get(command)
        return tuple(t for t in (held[0] if held else None, previous) if t)

    async def token(self, command: tuple[str, ...], ttl: float, endpoint: str) -> str:
        """A current token. Raises UpstreamError (kind ``credential``) when the command
        fails or prints nothing."""
        async with self._lock:
            held = self._tokens.get(command)
            if held is not None and held[1] > self._clock():
                return held[0]
            token = await _run(command, endpoint)
            if held is not None and held[0] != token:
                self._previous[command] = held[0]
            self._tokens[command] = (token, self._clock() + ttl)
            return token


async def _run(command: tuple[str, ...], endpoint: str) -> str:
    failure = UpstreamError(
        f"the Entra ID token command of {endpoint} failed", endpoint=endpoint, kind="credential"
    )
    try:
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,  # may echo the token or a secret: not kept
        )
    except OSError:
        raise failure from None
    try:
        async with asyncio.timeout(_TOKEN_COMMAND_TIMEOUT):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise failure from None
    token = out.decode("utf-8", "replace").strip()
    if proc.returncode != 0 or not token:
        raise failure
    return token


class AzureOpenAIAdapter(OpenAICompatAdapter):
    """Calls an Azure OpenAI deployment on the pooled client."""

    def __init__(self, http: UpstreamHTTP, tokens: EntraTokens | None = None) -> None:
        super().__init__(http)
        self._tokens = tokens or EntraTokens()

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        """POST the deployment's /chat/completions. Raises UpstreamError, token redacted."""
        try:
            return await super().complete(target, body)
        except UpstreamError as err:
            raise self._redacted(err, target) from None

    async def embed(self, target: UpstreamTarget, body: JSON) -> JSON:
        """POST the deployment's /embeddings. Raises UpstreamError, token redacted."""
        try:
            return await super().embed(target, body)
        except UpstreamError as err:
            raise self._redacted(err, target) from None

    def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        """The deployment's chat stream (see the base class). Raises UpstreamError, token
        redacted."""
        return MappedBatches(
            super().stream(target, body), functools.partial(self._redacted, target=target)
        )

    def _redacted(self, err: UpstreamError, target: UpstreamTarget) -> UpstreamError:
        settings = target.azure
        if settings is not None and settings.entra_token_command:
            for token in self._tokens.sent(settings.entra_token_command):
                redacted(err, token)
        return err

    def _url(self, target: UpstreamTarget, path: str) -> str:
        settings = target.azure or _DEFAULTS
        deployment = settings.deployment or target.upstream_model
        version = settings.api_version
        return (
            f"{target.base_url.rstrip('/')}/openai/deployments/{quote(deployment, safe='')}"
            f"{path}?api-version={quote(version, safe='')}"
        )

    async def _auth(self, target: UpstreamTarget) -> dict[str, str]:
        settings = target.azure
        if settings is not None and settings.entra_token_command:
            token = await self._tokens.token(
                settings.entra_token_command, settings.entra_token_ttl_seconds, target.endpoint
            )
            return {"authorization": f"Bearer {token}"}
        return {"api-key": target.api_key} if target.api_key else {}

    def _relayed(self, chunk: JSON) -> bool:
        # Azure opens a stream with the prompt's filter results in a chunk that is not a
        # chat.completion.chunk (no object, no choices): nothing of the answer.
        return bool(chunk.get("choices") or chunk.get("usage"))

    def _error(
        self, target: UpstreamTarget, status: int, headers: Mapping[str, str], body: bytes
    ) -> UpstreamError:
        err = error_from_status(target.endpoint, status, headers, body)
        code = _error_code(body)
        if status == 400 and code == CONTENT_FILTER:
            return ContentFilteredError(
                err.message, endpoint=target.endpoint, status=400, body=body, kind=CONTENT_FILTER
            )
        if status in (403, 429):
            # Decided here, whatever a generic reading of the body concluded: Azure's rate
            # limit messages mention quota increases without any quota being spent.
            quota = code in _QUOTA_CODES or any(m in body.lower() for m in _QUOTA_MARKERS)
            if quota:
                err.kind = QUOTA_EXHAUSTED
            elif status == 429 and meters_rate(headers):
                err.kind = RATE_LIMIT_EXCEEDED  # its TPM/RPM: a pace
            else:
                err.kind = f"http_{status}"
        return err  # a 429's retry-after: error_from_status reads retry-after-ms too


def _error_code(body: bytes) -> str | None:
    err = error_object(body).get("error")
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) else None
