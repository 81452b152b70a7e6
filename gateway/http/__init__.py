"""What every wing that serves HTTP shares, and nothing above it: the request, its answer and
the id the answer carries (``request``), the one table from error to HTTP status (``errors``)
and the lifetime of a part of the ingress (``component``). Imports only ``schemas`` and the
standard library; any gateway wing may import it.
"""

from __future__ import annotations

# Its modules are imported by name; nothing is re-exported here.
__all__: list[str] = []
