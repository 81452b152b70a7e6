"""Where ``Targets`` lived: it resolves candidates beside the plan walk now
(``gateway.ingress.plan_walk``); re-exported here for the importers outside this wing
(``gateway.process`` and its tests), never imported on the request path."""

from gateway.ingress.plan_walk import NO_SECRETS, FallbackTargets, SecretSource, Targets

__all__ = ["NO_SECRETS", "FallbackTargets", "SecretSource", "Targets"]
