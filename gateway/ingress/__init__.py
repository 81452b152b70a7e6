"""The ingress: one request's way from the ASGI call to the answer.

The ASGI app and composition root (``app``), the HTTP/1.1 edge under the request
(``http_edge``; the request itself and the error table are ``gateway.http``'s), the client
surfaces (``surfaces``), the inference pipeline (``pipeline``), the public models a request may
be served by, their plans and each candidate's credential resolved (``plan_walk``), the
model list and health endpoints (``introspection``), the admin routes that need the ingress's
parts (``admin_routes``), the failover loop (``dispatch``, with its whole-answer attempt; its
rules in ``failover``, its stream attempt in ``stream_attempt``, what it carries in
``request_info``), settling an attempt: its usage, cost and capacity lease (``settling``),
per-request accounting with the request-log outbox (``accounting``), metrics, the operator
endpoints the ingress serves besides inference (``operations``) and explain (``explain``:
``POST /admin/routing/explain``, the live path run dry). Imports ``bus``, ``schemas`` and the
gateway's lower wings (tests/architecture/test_layers.py), never ``actors``.

Also here: ``admission``, ``capacity_health``, ``hedging``.
"""

from __future__ import annotations

# Its modules are imported by name; nothing is re-exported here.
__all__: list[str] = []
