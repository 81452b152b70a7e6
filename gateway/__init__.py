"""The HTTP ingress: client wire formats, upstream adapters, dispatch and the ASGI app.

The subpackages and modules are imported by name (``from gateway.formats import
anthropic_messages``); this package re-exports nothing, so importing one leaf (a format, an
adapter) never loads the whole app.
"""

from __future__ import annotations

__all__: list[str] = []
