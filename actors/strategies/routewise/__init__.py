"""``router: routewise``: the cost-aware LP strategy of spec "RouteWise", over the
``llm-routewise`` library (its cost curves, LP, latency profiles and hedging math).

``params`` is the ``router_params:`` model, ``solver`` the exact O(n log n) LP, ``evidence``
what the policy learns (TTFT profiles, output lengths, cost envelope), ``candidates`` how one
route looks to the LP (effective cost, latency) and ``strategy`` the decision a ModelActor
hosts.
"""

from __future__ import annotations

from actors.strategies import register_strategy
from actors.strategies.routewise.candidates import Candidate
from actors.strategies.routewise.host import RouteWiseHost
from actors.strategies.routewise.params import RESOURCE_KEYS, RouteWiseParams
from actors.strategies.routewise.strategy import (
    RouteWiseStrategy,
    reference_pricing,
    startup_problem,
)

register_strategy("routewise", RouteWiseParams, serves=RouteWiseHost.serves)(RouteWiseStrategy)

__all__ = [
    "RESOURCE_KEYS",
    "Candidate",
    "RouteWiseParams",
    "RouteWiseStrategy",
    "reference_pricing",
    "startup_problem",
]
