"""The admin API: ``/admin/<area>/<verb>`` over HTTP and the local operator socket.

``http`` (the bus helper and the generic HTTP API), ``keys``, ``routing`` and
``rules`` (their areas' HTTP routes), ``event_stream`` (``GET /events``, the operator
event stream as SSE) and ``local_socket`` (``llmgw admin``/``logs``/``events`` on the
gateway's own machine with no admin key). Imports ``auth`` and ``http`` of the gateway's
wings only.

Also here: ``limits``, ``routewise``.
"""

from __future__ import annotations

# Its modules are imported by name; nothing is re-exported here.
__all__: list[str] = []
