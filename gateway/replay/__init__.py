"""``llmgw replay``: a trace through the real routing on a virtual clock, against simulated
providers, compared across configs.

Process wiring (it builds the actor tree, like ``gateway.process``): ``vloop`` (the virtual
time loop), ``trace`` and ``synth`` (requests), ``requests`` (a trace request on the wire),
``callers`` (the trace's gateway API keys), ``providers``, ``simulated`` and ``answers``
(upstream behaviour behind the one ``Adapter`` seam, and its wire shapes), ``runner`` (one
config through the real gateway), ``oracle``, ``report`` and ``plots``.
"""

from __future__ import annotations

# Its modules are imported by name; nothing is re-exported here.
__all__: list[str] = []
