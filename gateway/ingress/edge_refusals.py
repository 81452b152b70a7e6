"""The refusals every engine's connection layer makes before the app runs, without any
server's code: why a request head is refused (:func:`head_refusal`: what one parser reads one
way and another on the path may read another), and the server's own answer refusing a
request, in the caller's API shape (:func:`refusal_answer`). ``gateway.ingress.http_edge``
(under Hypercorn) and ``gateway.process.h1`` (the builtin engine) both use them; the builtin
engine imports no Hypercorn module until a connection speaks HTTP/2.
"""

from __future__ import annotations

import logging
import re
import uuid

from gateway.ingress.surfaces import CHAT, MESSAGES, RESPONSES, Surface

logger = logging.getLogger("gateway.ingress.http_edge")  # where these refusals always logged

HEADER_TIMEOUT = 10.0  # seconds, the default of ``server.header_timeout_seconds``
HEAD_END = re.compile(rb"\n\r?\n")  # where h11 ends a head (it takes a bare LF too)
_FOLD = re.compile(rb"\r\n[ \t]")
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:", re.IGNORECASE)
# RFC 9112 6.3: any other framing leaves the body's length unknown, so the request is malformed.
CHUNKED_LAST = "Transfer-Encoding must end with chunked, applied once"
_TRANSFER_ENCODING = re.compile(rb"\r\ntransfer-encoding:([^\r]*)", re.IGNORECASE)


def head_refusal(head: bytes) -> str | None:
    """Why a request ``head`` (its bytes up to and including the blank line) is refused, or
    None: what h11 reads one way and another parser on the path may read another."""
    # Counts and searches over the whole head, not a Python step per line: every request
    # passes here. The first offending line names the refusal.
    if head.count(b"\n") != head.count(b"\r\n"):
        return "a header line ended by a bare LF is refused: end lines with CRLF"
    fold = _FOLD.search(head)
    fold_at = fold.start() if fold is not None else len(head)
    for n, name in enumerate(_CONTENT_LENGTH.finditer(head)):
        if name.start() > fold_at:
            break
        if n or b"," in head[name.end() : head.find(b"\r\n", name.end())]:
            return "Content-Length must be given once, as a single number"
    if fold is not None:
        return "a header folded over several lines (obs-fold) is refused"
    if b"ransfer-" in head or b"RANSFER-" in head:  # rare: most bodies say their length
        return _coding_refusal(head)
    return None


def _coding_refusal(head: bytes) -> str | None:
    # h11 answers 501 to any coding but a lone chunked; chunked applied twice, or not last,
    # is a framing error instead (RFC 9112 6.3: 400), as the builtin engine's parser says.
    codings = b",".join(m.group(1) for m in _TRANSFER_ENCODING.finditer(head)).lower()
    named = [c.strip() for c in codings.split(b",")] if codings else []
    if named and (named.count(b"chunked") > 1 or named[-1] != b"chunked"):
        return CHUNKED_LAST
    return None


def refusal_answer(
    status: int, message: str, code: str, target: bytes
) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The headers and body of the server's own answer refusing a request for ``target``
    (every engine's): in the caller's API shape, with an ``x-request-id``, saying the
    connection closes."""
    request_id = f"edge-{uuid.uuid4().hex[:16]}"
    logger.debug("refused a request (%d %s) as %s", status, message, request_id)
    body = surface_of(target).error_body(status, message, code, None)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        (b"x-request-id", request_id.encode()),
    ]
    return headers, body


def surface_of(target: bytes) -> Surface:
    """The API shape an answer to a request for ``target`` takes."""
    if target.startswith(b"/v1/messages"):
        return MESSAGES
    if target.startswith(b"/v1/responses"):
        return RESPONSES
    return CHAT
