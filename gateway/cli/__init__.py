"""The ``llmgw`` command: ``main`` (the entry point and ``serve``) and one module per
operator subcommand (``admin``, ``events``, ``keys``, ``logs``; ``common`` is what
they share).

Also here: ``keys_offline``, ``logs_offline``.
"""

from __future__ import annotations

# Its modules are imported by name; nothing is re-exported here.
__all__: list[str] = []
