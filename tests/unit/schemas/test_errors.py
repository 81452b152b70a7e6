"""Errors across the bus: an ErrorReply turns back into the same error."""

from __future__ import annotations

from schemas import AllCircuitsOpenError, InvalidRequestError, error_from_reply


def test_error_reply_round_trip_keeps_class_retry_after_and_param() -> None:
    bad = error_from_reply(InvalidRequestError("too long", param="messages").to_reply())
    assert isinstance(bad, InvalidRequestError) and bad.param == "messages"
    busy = error_from_reply(AllCircuitsOpenError("busy", retry_after=3.5).to_reply())
    assert isinstance(busy, AllCircuitsOpenError) and busy.retry_after == 3.5
