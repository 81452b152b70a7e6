"""Steering at the ingress: the model field's intent resolved to ordered public models.

``resolver`` (``auto``, ``auto:<axis>``, ``auto:<chain>``), ``view`` (the steering
owners' state as the ingress sees it), ``rules`` (the routing rule set's view and
match) and ``labels`` (the ``x-llmgw-metadata`` header the rules read). Imports
``auth``, ``formats`` and ``http`` of the gateway's wings, never the ingress (which runs
``POST /admin/routing/explain``, the same path dry, in ``gateway.ingress.explain``).
"""

from __future__ import annotations

# Its modules are imported by name; nothing is re-exported here.
__all__: list[str] = []
