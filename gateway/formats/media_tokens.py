"""What inline media count for in the gateway's own prompt estimate
(``openai_chat.estimate_prompt_tokens``: about 4 bytes of the body a token, what its
context-window check and ``count_tokens`` use), as their base64 says little about what a
model bills: a base64 image counts as at most :data:`IMAGE_TOKENS`, and a base64 PDF
as :data:`PAGE_TOKENS` a page when its pages can be counted (a PDF is mostly images and
fonts: its bytes said 333,000 tokens for a 3-page 1 MB file, so the context-window check
refused it on every Claude route). Both the Messages shape (a ``base64`` source with its
``media_type``) and data URLs (chat's ``image_url`` and ``file_data``, Responses' parts)
are read.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

__all__ = ["IMAGE_TOKENS", "MEDIA_BODY", "PAGE_TOKENS", "media_sizes"]

IMAGE_TOKENS = 1_600
"""The most an image is estimated at: about what Claude (an image resized to 1.15 megapixels),
GPT-4o (high detail) and Gemini bill one. Its base64 at 4 bytes a token said 150,000 tokens
for a 600 KB image."""
PAGE_TOKENS = 3_000
"""A PDF page's estimate: the most of Anthropic's 1,500-3,000 tokens a page (its text, and
the page as an image)."""
MEDIA_BODY = 8_192
"""A smaller body holds no media worth walking it for."""
_PDF_URL = "data:application/pdf;base64,"
# A page object's type (not the /Pages tree's); page objects inside a compressed object
# stream are not seen: such a PDF keeps its byte estimate.
_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")


def media_sizes(body: Any) -> list[tuple[int, int]]:
    """Each base64 image and PDF in ``body`` (a decoded request, in any client's shape): its
    length in the body, and its estimate in tokens."""
    found: list[tuple[int, int]] = []
    stack = [body]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            data = node.get("data")
            if node.get("type") == "base64" and type(data) is str:
                media = node.get("media_type")
                if type(media) is str and media.startswith("image/"):
                    found.append((len(data), IMAGE_TOKENS))
                    continue
                if media == "application/pdf":
                    found.append(_pdf(len(data), data))
                    continue
            stack.extend(node.values())
        elif type(node) is list:
            stack.extend(node)
        elif type(node) is str and node.startswith("data:"):
            if node.startswith("data:image/"):
                found.append((len(node), IMAGE_TOKENS))
            elif node.startswith(_PDF_URL):
                found.append(_pdf(len(node), node[len(_PDF_URL) :]))
    return found


def _pdf(size: int, data: str) -> tuple[int, int]:
    """A base64 PDF ``data``, ``size`` long in the body, and its estimate: :data:`PAGE_TOKENS`
    for each page object it holds, or its bytes' when none is seen (or it is not base64)."""
    try:
        pages = len(_PAGE.findall(base64.b64decode(data)))
    except (binascii.Error, ValueError):
        pages = 0
    return size, pages * PAGE_TOKENS if pages else size // 4
