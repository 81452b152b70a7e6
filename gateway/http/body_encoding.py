"""A request body sent with ``Content-Encoding``: gzip and deflate are decoded, as OpenAI's
API takes compressed bodies; the decoded size is held to the same limit as the body's (a
small gzip body may inflate a thousandfold: it is never decoded past the limit)."""

from __future__ import annotations

import zlib

from schemas import InvalidRequestError, RequestTooLargeError, UnsupportedEncodingError

# The zlib window bits of each coding (RFC 9110 8.4.1): gzip's header, deflate's zlib one.
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decoded(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` with the codings ``encoding`` (a ``Content-Encoding`` value, in the order
    they were applied) undone. Raises UnsupportedEncodingError (415) for a coding other than
    gzip, deflate or identity, RequestTooLargeError once the decoded body passes ``limit``
    bytes, InvalidRequestError when the body is not whole data of its coding."""
    codings = [name.strip().lower() for name in encoding.split(",") if name.strip()]
    for name in reversed(codings):
        if name == "identity":
            continue
        wbits = _WBITS.get(name)
        if wbits is None:
            raise UnsupportedEncodingError(
                f"Content-Encoding {name[:40]!r} is not supported: send the body as it is, "
                "or gzip or deflate it"
            )
        inflater = zlib.decompressobj(wbits)
        try:
            body = inflater.decompress(body, limit + 1)  # never more than the limit allows
        except zlib.error:
            raise InvalidRequestError(f"the request body is not valid {name} data") from None
        if len(body) > limit:
            raise RequestTooLargeError(f"request body is over the {limit}-byte limit decoded")
        if not inflater.eof:
            raise InvalidRequestError(f"the request body's {name} data is cut short")
    return body
