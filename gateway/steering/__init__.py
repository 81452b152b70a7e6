"""Steering at the ingress: the model field's intent resolved to ordered public models.

``resolver`` (``auto``, ``auto:<axis>``, ``auto:<chain>``), ``view`` (the steering
owners' state as the ingress sees it), ``rules`` (the routing rule set's view and
match), ``labels`` (the ``x-llmgw-metadata`` header the rules read) and ``explain``
(``POST /admin/routing/explain``, the same path run dry).
"""

from __future__ import annotations

# Its modules are imported by name; nothing is re-exported here.
__all__: list[str] = []
