"""Affinity keys: API key hash, grant, IPv6 folded to /64, X-Forwarded-For only if trusted;
conversation keys of steered pins."""

from __future__ import annotations

from typing import Any

from gateway.http.request import HttpRequest
from gateway.steering.labels import affinity_key, conversation_key, fold_address


def _req(client: str, headers: dict[str, str] | None = None) -> HttpRequest:
    scope: dict[str, Any] = {
        "client": (client, 5555),
        "headers": [(k.encode(), v.encode()) for k, v in (headers or {}).items()],
    }

    async def receive() -> dict[str, Any]:
        return {}

    async def send(msg: Any) -> None:
        return None

    return HttpRequest(scope, receive, send)


def test_ipv6_addresses_in_one_64_fold_to_one_key() -> None:
    assert fold_address("2001:db8:1:2:aaaa::1") == fold_address("2001:db8:1:2:bbbb::9")
    assert fold_address("2001:db8:1:2::1") == "2001:db8:1:2::/64"


def test_ipv4_address_is_kept_whole() -> None:
    assert fold_address("10.1.2.3") == "10.1.2.3"


def test_authenticated_caller_key_is_its_key_hash() -> None:
    assert affinity_key(_req("10.0.0.1"), key_hash="abc", trust_proxy_headers=False) == "key:abc"


def test_grant_header_wins_over_address() -> None:
    req = _req("10.0.0.1", {"x-inference-grant": "job-7"})
    assert affinity_key(req, key_hash=None, trust_proxy_headers=False) == "grant:job-7"


def test_forwarded_for_is_ignored_unless_trusted() -> None:
    req = _req("10.0.0.1", {"x-forwarded-for": "203.0.113.9, 10.0.0.1"})
    assert affinity_key(req, key_hash=None, trust_proxy_headers=False) == "ip:10.0.0.1"
    assert affinity_key(req, key_hash=None, trust_proxy_headers=True) == "ip:203.0.113.9"


def test_client_chosen_parts_of_the_key_are_cut_to_a_bound() -> None:
    req = _req("10.0.0.1", {"x-inference-grant": "g" * 10_000, "x-forwarded-for": "f" * 10_000})
    anonymous = _req("10.0.0.1", {"x-forwarded-for": "f" * 10_000 + ", 10.0.0.1"})

    assert affinity_key(req, key_hash=None, trust_proxy_headers=True) == "grant:" + "g" * 128
    assert affinity_key(anonymous, key_hash=None, trust_proxy_headers=True) == "ip:" + "f" * 64


def test_a_conversation_is_its_opening_or_the_clients_prompt_cache_key() -> None:
    opening = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    later = [*opening, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "?"}]
    other = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "bye"}]

    first = conversation_key({"messages": opening})
    assert first and conversation_key({"messages": later}) == first  # every turn repeats it
    assert conversation_key({"messages": other}) != first
    declared = conversation_key({"messages": other, "prompt_cache_key": "thread-7"})
    assert declared == conversation_key({"messages": opening, "prompt_cache_key": "thread-7"})
    assert declared != first
    assert conversation_key({"input": "embed me"}) == ""  # no messages: no prompt cache
