"""Which semantic-convention versions spans and metrics speak (``OTEL_SEMCONV_STABILITY_OPT_IN``).

The variable is a comma-separated list, read once when telemetry starts:

- HTTP (stable conventions): ``http`` emits the stable names only, ``http/dup`` the stable
  and the old experimental ones (``http.method``, ``http.status_code``, ``http.target``,
  ``http.scheme``, ``net.host.name``/``port``, ``net.peer.name``/``port``). Without either
  the stable names are emitted: the conventions' default is to keep what an instrumentation
  emitted before, and llmgw never emitted the old ones.
- GenAI (Development): ``gen_ai_latest_experimental`` emits the latest experimental
  conventions (``gen_ai.provider.name``; captured content as ``gen_ai.input.messages``,
  ``gen_ai.output.messages``, ``gen_ai.system_instructions``). Without it, v1.36.0's names
  (``gen_ai.system``; captured content as the ``gen_ai.*.message`` and ``gen_ai.choice``
  span events), as the GenAI conventions ask of instrumentations by default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_VARIABLE = "OTEL_SEMCONV_STABILITY_OPT_IN"
_CAPTURE_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


@dataclass(frozen=True, slots=True)
class Semconv:
    """The convention choices: HTTP old names too (``http_old``), latest GenAI names
    (``genai_latest``), and the provider attribute's name that follows from the latter."""

    http_old: bool = False
    genai_latest: bool = False

    @property
    def provider_key(self) -> str:
        """``gen_ai.provider.name`` (latest) or ``gen_ai.system`` (v1.36.0)."""
        return "gen_ai.provider.name" if self.genai_latest else "gen_ai.system"

    @classmethod
    def parse(cls, value: str) -> Semconv:
        """The choices a ``OTEL_SEMCONV_STABILITY_OPT_IN`` value makes (unknown entries are
        ignored, as other instrumentations read the same variable)."""
        entries = {part.strip().lower() for part in value.split(",")}
        return cls(
            http_old="http/dup" in entries,
            genai_latest="gen_ai_latest_experimental" in entries,
        )

    @classmethod
    def from_env(cls) -> Semconv:
        """The choices of this process's environment."""
        return cls.parse(os.environ.get(_VARIABLE, ""))


def capture_content(configured: bool) -> bool:
    """Whether message content is captured: ``telemetry.capture_content``, or
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` (either opts in)."""
    return configured or os.environ.get(_CAPTURE_VARIABLE, "").strip().lower() in _CAPTURING


# "true" is the long-standing value; the others are the latest instrumentations' modes, all
# of which put content on the span here (llmgw emits no log records).
_CAPTURING = frozenset({"true", "span_only", "event_only", "span_and_event"})
