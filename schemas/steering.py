"""Messages of the steering conversation: chains, steering settings and scoring evidence.

- ``ChainState`` — a ChainActor's chain (``llmgw.chain.<name>.state`` on every change, and
  the answer to ``ChainGet`` on ``llmgw.chain.<name>.resolve``).
- ``ChainEdit`` — the SteeringActor forwards an admin change to the chain's owner
  (``llmgw.chain.<name>.edit``), answered with the new ``ChainState``.
- ``SteeringState`` — the deployment's steering settings and which chains exist
  (``llmgw.steering.state`` on every change).
- ``Evidence`` — what the scoring owner learned from observations, with the guardrail
  multipliers as of now (``llmgw.steering.evidence``, at a bounded rate).
- ``SteeringGet`` -> ``SteeringSnapshot`` — all of the above at once, for a view that starts.
- ``ChainsCheck`` -> ``ChainsChecked`` — a config reload asks, before it changes anything,
  which chains would name a model the new config lacks (``llmgw.steering.check``).
- ``ChainModelsDropped`` — a chain an admin shaped named models its config lacks when it
  started: they were taken out of it (``llmgw.events.chains``).
"""

from __future__ import annotations

import msgspec


class ChainEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One position of a chain: a public model id, switched on or off."""

    model: str
    enabled: bool = True


class ChainState(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A chain as its owner holds it: ``org`` "" is deployment-wide."""

    name: str
    org: str = ""
    backfill: bool = False
    models: tuple[ChainEntry, ...] = ()
    seq: int = 0


class ChainGet(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask a ChainActor for its ChainState."""


class ChainEdit(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Change a chain: ``verb`` is ``set_models`` (``models``), ``move`` (``model`` to
    ``position``, from 1), ``set_enabled`` (``model``, ``enabled``), ``preset`` (``order``:
    the catalogue ranked by the preset, best first) or ``set_backfill`` (``backfill``)."""

    verb: str
    models: tuple[ChainEntry, ...] = ()
    model: str = ""
    position: int = 0
    enabled: bool = True
    backfill: bool = False
    order: tuple[str, ...] = ()


class Guardrails(msgspec.Struct, frozen=True, kw_only=True):
    """The guardrail thresholds (``steering.guardrails``)."""

    allowance_threshold: float = 0.8
    allowance_floor: float = 0.2
    rate_limit_penalty: float = 0.5
    rate_limit_decay_seconds: float = 300.0


class SteeringState(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The steering settings and the names of every chain that exists."""

    active_chain: str | None = None
    profile: str = "balanced"
    weights: tuple[float, float, float] = (0.5, 0.25, 0.25)
    guardrails: Guardrails = Guardrails()
    exploration: float = 0.05
    chains: tuple[str, ...] = ()
    seq: int = 0


class ModelEvidence(msgspec.Struct, frozen=True, kw_only=True):
    """What live traffic says about one public model.

    ``ttft_ms`` (streams) and ``tokens_per_second`` (every answer) are EWMAs, None without
    evidence; ``reliability`` is the EWMA success of its attempts from a neutral 0.5 prior.
    ``allowance_multiplier`` and ``rate_limit_multiplier`` are the guardrails as of ``ts``.
    ``remaining`` is the free allowance left this month (tokens, else requests; None: none
    declared); ``healthy`` is false while no route of it could serve.
    """

    model: str
    ttft_ms: float | None = None
    tokens_per_second: float | None = None
    reliability: float = 0.5
    attempts: int = 0
    tokens_used: int = 0
    requests_used: int = 0
    remaining: float | None = None
    allowance_used: float | None = None
    allowance_multiplier: float = 1.0
    rate_limit_multiplier: float = 1.0
    healthy: bool = True


class Evidence(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Every catalogue model's evidence and the deployment mode, as of ``ts``."""

    models: tuple[ModelEvidence, ...] = ()
    degraded: bool = False
    month: str = ""
    ts: float = 0.0
    seq: int = 0


class SteeringGet(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask the SteeringActor for a SteeringSnapshot."""


class SteeringSnapshot(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Settings, every chain and the evidence: what an ingress's view starts from."""

    state: SteeringState
    chains: tuple[ChainState, ...] = ()
    evidence: Evidence = Evidence()


class ChainsCheck(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask the SteeringActor which chains would name a model of none of ``models`` were it
    started on a config with these model ids and these ``chains:`` names (a reload's check,
    asked before the reload changes anything)."""

    models: tuple[str, ...]
    chains: tuple[str, ...] = ()


class ChainModels(msgspec.Struct, frozen=True, kw_only=True):
    """The ``models`` chain ``chain`` names that a config lacks, and its entries without
    them (``kept``: what ``chains set_models`` would leave it)."""

    chain: str
    models: tuple[str, ...]
    kept: tuple[ChainEntry, ...] = ()


class ChainsChecked(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The answer to ``ChainsCheck``: each chain that would name models the config lacks
    (only a chain an admin command made or edited can: it outlives a reload), by name, and
    the ``active`` chain an admin command set when it would not run ("": none); neither when
    the reload may go on."""

    gone: tuple[ChainModels, ...] = ()
    active: str = ""


class ChainModelsDropped(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Chain ``chain``, shaped by an admin command, named ``models``, which its config lacked
    when it started (the file lost them while no gateway ran, or a host runs another file):
    they were taken out of it; ``before`` is the chain's models as they were."""

    chain: str
    models: tuple[str, ...]
    before: tuple[str, ...] = ()
    ts: float = 0.0
