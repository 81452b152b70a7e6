"""A Messages request's media blocks (``image`` and ``document``) as canonical chat parts.

An image is an ``image_url`` part (a base64 source as a data URL, or its URL). A document
with a ``base64`` source (a PDF, as Claude Code sends what its Read tool read) is a ``file``
part with the data URL in ``file_data`` and its ``title`` as the ``filename``, the part the
OpenAI SDK sends and every translating adapter reads (anthropic: a ``document`` block again,
bedrock: a Converse ``document``, gemini: ``inlineData``); a ``text`` source is its text.
The document's ``citations``, ``context`` and the answer's citations have no chat form and
are dropped. Refused (InvalidRequestError naming the field): a source by file id, a
document by URL or of content blocks: a stateless gateway holds no files and chat parts
carry no such sources.
"""

from __future__ import annotations

from gateway.formats._common import JSON, want_dict, want_str
from schemas import InvalidRequestError

__all__ = ["document_part", "image_part"]


def image_part(block: JSON, path: str) -> JSON:
    """The chat part of an ``image`` block. Raises InvalidRequestError."""
    source = want_dict(block.get("source"), f"{path}.source")
    kind = source.get("type")
    spath = f"{path}.source"
    if kind == "base64":
        media_type = want_str(source, "media_type", spath)
        url = f"data:{media_type};base64,{want_str(source, 'data', spath)}"
    elif kind == "url":
        url = want_str(source, "url", spath)
    else:
        raise InvalidRequestError(
            f"{spath}.type: '{kind}' image sources are not supported (use 'base64' or 'url')",
            param=f"{spath}.type",
        )
    return {"type": "image_url", "image_url": {"url": url}}


def document_part(block: JSON, path: str) -> JSON:
    """The chat part of a ``document`` block. Raises InvalidRequestError."""
    spath = f"{path}.source"
    source = want_dict(block.get("source"), spath)
    kind = source.get("type")
    if kind == "text":
        return {"type": "text", "text": want_str(source, "data", spath)}
    if kind != "base64":
        raise InvalidRequestError(
            f"{spath}.type: '{kind}' document sources are not supported (use 'base64' or 'text')",
            param=f"{spath}.type",
        )
    media_type = want_str(source, "media_type", spath)
    file: JSON = {"file_data": f"data:{media_type};base64,{want_str(source, 'data', spath)}"}
    title = block.get("title")
    if isinstance(title, str) and title:
        file["filename"] = title
    return {"type": "file", "file": file}
