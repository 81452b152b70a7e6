"""Where a NATS connection's replies arrive: its own inbox prefix, from the URL's user or
``bus.inbox_prefix``, so the NATS permissions can keep each user's replies to itself."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bus.inbox import inbox_prefix_for
from schemas.config import BusConfig


@pytest.mark.parametrize(
    ("url", "prefix"),
    [
        ("nats://ingress:pw@nats:4222", "_INBOX_ingress"),
        ("nats://actors-1:pw@a:4222, nats://actors-1:pw@b:4222", "_INBOX_actors-1"),
        ("nats://nats:4222", "_INBOX"),
        ("nats://s3cr3t-token@nats:4222", "_INBOX"),  # a token is no user name
        ("nats://obs%5Fv2:pw@nats:4222", "_INBOX_obs_v2"),
    ],
)
def test_the_inbox_prefix_follows_the_user_of_the_url(url: str, prefix: str) -> None:
    assert inbox_prefix_for(url) == prefix


def test_an_explicit_prefix_wins_over_the_user() -> None:
    assert inbox_prefix_for("nats://ingress:pw@nats:4222", "_INBOX_edge") == "_INBOX_edge"


@pytest.mark.parametrize("explicit", ["INBOX_x", "_INBOX.x", "_INBOX_*", "_INBOX x", ""])
def test_a_prefix_that_is_not_one_inbox_token_is_refused(explicit: str) -> None:
    with pytest.raises(ValueError, match="inbox prefix"):
        inbox_prefix_for("nats://nats:4222", explicit)


@pytest.mark.parametrize("user", ["a.b", "a*", "a%3Eb", "a%20b"])
def test_a_user_name_that_cannot_be_a_subject_token_needs_an_explicit_prefix(user: str) -> None:
    with pytest.raises(ValueError, match=r"bus\.inbox_prefix"):
        inbox_prefix_for(f"nats://{user}:pw@nats:4222")
    assert inbox_prefix_for(f"nats://{user}:pw@nats:4222", "_INBOX_ops") == "_INBOX_ops"


def test_the_config_key_takes_only_an_inbox_token() -> None:
    assert BusConfig(url="nats://n:4222", inbox_prefix="_INBOX_edge").inbox_prefix == "_INBOX_edge"
    assert BusConfig().inbox_prefix is None
    with pytest.raises(ValidationError):
        BusConfig(url="nats://n:4222", inbox_prefix="_INBOX.edge")
