"""The gateway's wings (``gateway/<wing>/``) in layers: a wing imports only wings of lower
layers (any import: lazy and typing-only ones too), so no two wings can ever form a loop.

A new wing must be given its layer here. ``http`` (the request, the error table, the
component lifetime, busy polling) sits at the bottom, under the formats and adapters: every
wing may import it, and it imports none.
"""

from __future__ import annotations

from tests.architecture.measure import wing_graph

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"cli"}),  # the llmgw command: everything below it
    frozenset({"replay"}),  # the actors and the ingress on a virtual clock
    frozenset({"process"}),  # serve, reload, the sidecars: wires the ingress to the actors
    frozenset({"ingress"}),  # the ASGI app and the request path
    frozenset({"dashboard", "admin", "telemetry"}),  # parts the ingress serves or feeds
    frozenset({"steering"}),  # auto and its rules, from views
    frozenset({"auth"}),  # who is calling
    frozenset({"formats", "adapters"}),  # leaves
    frozenset({"http"}),  # under every wing (the upstream client polls through it)
)
"""Top first."""


def _layer_of() -> dict[str, int]:
    return {wing: depth for depth, layer in enumerate(LAYERS) for wing in layer}


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every (importer, imported) pair of ``graph`` where the imported wing is not in a
    strictly lower layer than the importer."""
    layer = _layer_of()
    return sorted(
        (wing, other)
        for wing, imported in graph.items()
        for other in imported
        if layer[other] <= layer[wing]
    )


def test_every_wing_has_exactly_one_layer() -> None:
    placed = [wing for layer in LAYERS for wing in layer]
    assert len(placed) == len(set(placed))
    assert set(placed) == set(wing_graph())


def test_no_wing_imports_a_wing_of_its_own_or_a_higher_layer() -> None:
    assert upward_imports(wing_graph()) == []


def test_the_layer_check_sees_an_upward_and_a_sideways_import() -> None:
    graph: dict[str, set[str]] = {w: set() for layer in LAYERS for w in layer}
    graph["http"].add("ingress")  # a leaf reaching up
    graph["admin"].add("dashboard")  # siblings of one layer
    graph["ingress"].add("http")  # downward: allowed
    assert upward_imports(graph) == [("admin", "dashboard"), ("http", "ingress")]
