"""SigV4 for ``bedrock`` routes, through botocore (never a signer of our own).

Credentials come from the route's key when it has one (``ACCESS_KEY_ID:SECRET_ACCESS_KEY``,
optionally ``:SESSION_TOKEN``: it then rides the key pool like any key, so a rejected one is
muted), else from botocore's credential chain (environment, shared config/credentials file
and the route's ``bedrock.profile``, container and instance roles). botocore is imported
lazily: only bedrock routes need it (the ``bedrock`` extra).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from schemas import UpstreamError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gateway.adapters.base import UpstreamTarget

SIGNING_NAME = "bedrock"
"""The SigV4 service name of bedrock-runtime (its service model's ``signingName``)."""


def split_key(key: str) -> tuple[str, str, str | None]:
    """(access key id, secret access key, session token) of a route key.

    Raises ValueError when the key is not ``ID:SECRET`` or ``ID:SECRET:TOKEN``.
    """
    parts = key.split(":", 2)
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise ValueError("a bedrock key is ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]")
    return parts[0], parts[1], parts[2] if len(parts) == 3 and parts[2] else None


class BedrockSigner:
    """Signs one request at a time; owns the resolved credential chain of each profile
    (bounded by the configured profiles)."""

    def __init__(self) -> None:
        self._chains: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    async def sign(
        self, target: UpstreamTarget, url: str, body: bytes, headers: Mapping[str, str]
    ) -> dict[str, str]:
        """``headers`` plus the SigV4 ones (``Authorization``, ``X-Amz-Date``, and
        ``X-Amz-Security-Token`` for temporary credentials). Raises UpstreamError when no
        credentials can be found."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        credentials = await self._credentials(target)
        request = AWSRequest(method="POST", url=url, data=body, headers=dict(headers))
        region = target.bedrock.region if target.bedrock else ""
        SigV4Auth(credentials, SIGNING_NAME, region).add_auth(request)
        return dict(request.headers.items())

    async def _credentials(self, target: UpstreamTarget) -> Any:
        from botocore.exceptions import BotoCoreError

        try:
            return await self._resolve(target)
        except BotoCoreError as exc:  # an unknown profile, a role that cannot be assumed...
            raise _no_credentials(target, type(exc).__name__) from None

    async def _resolve(self, target: UpstreamTarget) -> Any:
        from botocore.credentials import Credentials

        if target.api_key:
            try:
                key_id, secret, token = split_key(target.api_key)
            except ValueError as exc:
                raise _no_credentials(target, str(exc)) from None
            return Credentials(key_id, secret, token)
        profile = (target.bedrock.profile if target.bedrock else None) or ""
        chain = self._chains.get(profile)
        if chain is None:
            async with self._lock:
                chain = self._chains.get(profile)
                if chain is None:
                    # The chain may read files or ask the instance metadata service: off the loop.
                    chain = await asyncio.to_thread(_resolve_chain, profile or None)
                    if chain is None:
                        raise _no_credentials(target, "botocore's credential chain found none")
                    self._chains[profile] = chain
        refresh_needed = getattr(chain, "refresh_needed", None)
        if refresh_needed is not None and refresh_needed():
            return await asyncio.to_thread(chain.get_frozen_credentials)
        return chain.get_frozen_credentials()


def _resolve_chain(profile: str | None) -> Any:
    import botocore.session

    return botocore.session.Session(profile=profile).get_credentials()


def _no_credentials(target: UpstreamTarget, why: str) -> UpstreamError:
    # Nothing was sent; the route cannot serve until its credentials are fixed.
    return UpstreamError(
        f"route {target.endpoint} has no usable AWS credentials: {why}",
        endpoint=target.endpoint,
        kind="no_credentials",
    )
