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
