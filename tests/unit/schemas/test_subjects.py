"""Subject names: ids never add a token, and escaping is reversible."""

from __future__ import annotations

import pytest

from schemas import subjects


@pytest.mark.parametrize("raw", ["demo", "org/model:7b", "qwen2.5", "a b", "ünï", "~x", "", "*>"])
def test_token_of_any_id_is_one_reversible_token(raw: str) -> None:
    tok = subjects.token(raw)
    assert "." not in tok and "*" not in tok and ">" not in tok and " " not in tok
    assert subjects.untoken(tok) == raw


def test_model_route_subject_with_dotted_id_has_four_tokens() -> None:
    assert subjects.model_route("qwen2.5:7b").split(".")[2] == "qwen2~2e5~3a7b"
    assert len(subjects.model_route("qwen2.5:7b").split(".")) == 4


def test_every_event_kind_the_code_publishes_is_in_event_kinds() -> None:
    """`llmgw events --filter` refuses a kind outside EVENT_KINDS, so one missing there
    would make its events impossible to follow."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    published = {
        kind
        for package in ("actors", "gateway", "schemas")
        for path in (root / package).rglob("*.py")
        for kind in re.findall(r'subjects\.event\("([a-z_]+)"\)', path.read_text())
    }
    assert published, "no subjects.event(...) call found: the scan is broken"
    assert published <= set(subjects.EVENT_KINDS), published - set(subjects.EVENT_KINDS)
