"""Dashboard session tokens: signed, expiring, ended by sign-out, CSRF tied to the session."""

from __future__ import annotations

from gateway.dashboard.session import SessionSigner, deployment_secret
from schemas.config import DashboardConfig, GatewayConfig


def test_a_token_verifies_until_it_expires() -> None:
    signer = SessionSigner(b"s" * 32)
    token, session = signer.issue("k-1", "h-1", now=1000.0, lifetime=60.0)
    assert signer.verify(token, 1059.0) == session
    assert signer.verify(token, 1060.0) is None


def test_a_token_of_another_secret_or_altered_is_refused() -> None:
    token, _ = SessionSigner(b"a" * 32).issue("k-1", "h-1", now=0.0, lifetime=60.0)
    assert SessionSigner(b"b" * 32).verify(token, 1.0) is None
    signer = SessionSigner(b"a" * 32)
    head, mac = token.split(".")
    assert signer.verify(head[:-2] + "xx." + mac, 1.0) is None
    for junk in ("", ".", "a.b", "!!!.???", token + "x"):
        assert signer.verify(junk, 1.0) is None


def test_a_signed_out_session_is_refused_and_csrf_is_per_session() -> None:
    signer = SessionSigner(b"s" * 32)
    token, session = signer.issue("k-1", "h-1", now=0.0, lifetime=60.0)
    other_token, other = signer.issue("k-1", "h-1", now=0.0, lifetime=60.0)
    assert signer.csrf_ok(session, signer.csrf(session))
    assert not signer.csrf_ok(session, signer.csrf(other))
    assert not signer.csrf_ok(session, None)
    signer.ended.end(session.nonce, session.expires, now=1.0)
    assert signer.verify(token, 2.0) is None
    assert signer.verify(other_token, 2.0) == other


def test_the_secret_comes_from_config_else_the_admin_key_never_the_key_itself() -> None:
    assert deployment_secret(GatewayConfig(dashboard=DashboardConfig(secret="x"))) == b"x"
    derived = deployment_secret(GatewayConfig(admin_key="adm"))
    assert derived == deployment_secret(GatewayConfig(admin_key="adm"))
    assert b"adm" not in derived
    assert deployment_secret(GatewayConfig()) != deployment_secret(GatewayConfig())


def test_the_ended_set_is_bounded_and_ignores_what_is_over_anyway() -> None:
    signer = SessionSigner(b"s" * 32)
    signer.ended.end("gone", expires=5.0, now=10.0)
    assert "gone" not in signer.ended
    for i in range(10_050):
        signer.ended.end(f"n{i}", expires=100.0, now=10.0)
    assert len(signer.ended) <= 10_000
    assert "n10049" in signer.ended


def test_the_sign_in_token_matches_only_its_pre_session_cookie() -> None:
    signer = SessionSigner(b"s" * 32)
    token = signer.signin_csrf("cookie-1")
    assert signer.signin_ok("cookie-1", token)
    assert not signer.signin_ok("cookie-2", token)
    assert not signer.signin_ok(None, token)
    assert not signer.signin_ok("cookie-1", None)
    assert not SessionSigner(b"t" * 32).signin_ok("cookie-1", token)


def test_a_bootstrap_fingerprint_names_the_key_without_holding_it() -> None:
    signer = SessionSigner(b"s" * 32)
    fp = signer.bootstrap_fingerprint("adm-secret")
    assert fp == signer.bootstrap_fingerprint("adm-secret")
    assert fp != signer.bootstrap_fingerprint("adm-other")
    assert "adm-secret" not in fp and fp.startswith("bootstrap:")
