"""The private keys the client surfaces (``gateway.formats``) and the adapters
(``gateway.adapters``) put on canonical requests, answers and chunks for what only one of
them reads: one definition for both sides, which may not import each other. Every route that
does not act on a key drops it, as its provider refuses fields it does not know.
"""

from __future__ import annotations

CLAUDE_THINKING = "_claude_thinking"
"""Set on a canonical request whose ``thinking`` is Claude's (this surface's), not a chat
client's own provider extension (GLM's, DeepSeek's ``thinking``), which passes through as any
unknown field: ``openai_compat`` drops the config it marks (and the mark) before sending,
where OpenAI would refuse an argument it does not know."""
ANTHROPIC_BETA = "_anthropic_beta"
"""Set on a canonical request by the ingress to the Messages client's ``anthropic-beta``
header (Claude's feature flags: ``context-1m-...``, ``interleaved-thinking-...``), which an
``anthropic`` route sends on; an ``openai_compat`` route drops it."""
CLAUDE_CACHE = "_claude_cache"
"""Set on a canonical request carrying this surface's ``cache_control`` marks: an
``openai_compat`` route drops them (and the mark)."""
CLAUDE_NATIVE = "_claude_native"
"""Set on every canonical request of this surface: an object with what a Messages client
asks of Claude that chat has no field for. ``top_k`` (when sent); ``tool_errors``, the
``tool_use_id``s whose ``tool_result`` said ``is_error`` (their chat tool messages still
start with :data:`TOOL_ERROR_PREFIX`, for the routes that cannot say it otherwise). Its
presence also asks for Claude's own ``stop_reason``: an anthropic route puts it on the
answer's choice as :data:`CLAUDE_STOP_REASON` (``pause_turn``, ``refusal``,
``model_context_window_exceeded`` have no chat finish reason of their own)."""
CLAUDE_STOP_REASON = "_claude_stop_reason"
"""On a canonical answer's choice (or a stream's finish chunk's), for a request carrying
:data:`CLAUDE_NATIVE` only: Claude's ``stop_reason``, which the Messages renderer reports."""
START_USAGE = "_start_usage"
"""Set by the ``anthropic`` adapter on a stream's first canonical chunk: the usage Claude's
``message_start`` reported (input and cache tokens), which the Messages surface's own
``message_start`` shows; the chat renderer drops it, as a chat client reads its usage from
the one usage chunk at the end. The same literal is written there."""
RATE_REPORT = "_rate_report"
"""Set by an adapter on a whole canonical answer whose headers reported its provider's request
limit (a ``schemas.routing.RateReport``): the failover loop takes it off before anything else
reads the answer and puts it on the attempt's Observation (``rate``)."""
TOOL_ERROR_PREFIX = "Error: "
"""Chat tool messages have no error flag; the model must still learn that the tool failed."""
