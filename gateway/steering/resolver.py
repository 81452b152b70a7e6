"""Steering at the ingress: the model field's intent (``auto``, ``auto:<axis>``,
``auto:<chain>``) resolved into an ordered list of public models, from views, with no bus hop.

:class:`SteeringBook` is an immutable picture of the catalogue, the steering settings, the
chains and the scoring evidence, with every ordering precomputed (each axis, each chain in
its written order, and ``auto``: the active chain — or the built-in chain over the whole
catalogue in ``smartest`` order — by the deployment's profile). :class:`SteeringView` keeps
the current book: a ``steering.get`` when it starts, then the owners' state events, each of
which builds a new book (events are rare; requests are not). A request then costs a dict
lookup, a role filter, and the per-request parts: session affinity and exploration.

Scored orderings (profiles and axes) multiply by both guardrails; every ordering puts the
models that cannot serve now (no route usable) last, in their order.
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.http.request import bounded
from schemas import ChainState, Evidence, InvalidRequestError, ModelEvidence, SteeringState
from schemas.catalog import AUTO, AXES, AXIS_SYNONYMS, ascii_lower
from schemas.keys import role_rank
from schemas.scoring import (
    capability_scores,
    cheapness,
    reliability_scores,
    speed_scores,
    weighted_score,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Mapping, Sequence

    from schemas.config import ModelConfig

logger = logging.getLogger(__name__)

_PINS_MAX = 10_000
_AXIS_WEIGHTS = {
    "smartest": (1.0, 0.0, 0.0),
    "fastest": (0.0, 1.0, 0.0),
    "reliable": (0.0, 0.0, 1.0),
}


@dataclass(frozen=True, slots=True)
class Candidate:
    """One model of an ordering, with what it was ranked by."""

    model: str
    capability: float
    speed: float
    reliability: float
    allowance: float
    rate_limit: float
    score: float | None
    healthy: bool
    allowance_used: float | None = None


@dataclass(frozen=True, slots=True)
class Ordering:
    """Candidate models, best first (those that cannot serve now last), and the models left
    out with why. ``how`` names the profile, the axis or ``priority``."""

    how: str
    scored: bool
    weights: tuple[float, float, float] | None
    candidates: tuple[Candidate, ...]
    excluded: tuple[tuple[str, str], ...] = ()
    healthy: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        healthy = frozenset(c.model for c in self.candidates if c.healthy)
        object.__setattr__(self, "healthy", healthy)  # frozen: computed once, per book


@dataclass(frozen=True, slots=True)
class Resolution:
    """A steered request's target and the models it may be served by, in order."""

    target: str
    kind: str  # "auto", "axis" or "chain"
    chain: str | None
    axis: str | None
    ordering: Ordering
    models: tuple[str, ...]
    excluded: tuple[tuple[str, str], ...]
    explored: bool = False
    affinity: bool = False
    exploration: float = 0.0
    degraded: bool = False
    rule: str = ""  # the routing rule that chose this target for an ``auto`` request
    # The caller's conversation ("" : none, so no pin) and the operator's settings the
    # ordering followed (a pin made under other settings is stale).
    session: str = ""
    revision: Hashable = None

    def brief(self) -> tuple[str, float | None, str, float | None]:
        """(chosen model, its score, runner-up, its score) for the decision event."""
        by_model = {c.model: c for c in self.ordering.candidates}
        first = by_model[self.models[0]]
        second = by_model.get(self.models[1]) if len(self.models) > 1 else None
        return (
            first.model,
            first.score,
            second.model if second else "",
            second.score if second else None,
        )


def is_steering(name: str) -> bool:
    """Whether the model field names an intent rather than a model."""
    return ascii_lower(name[:4]) == AUTO and (len(name) == 4 or name[4] == ":")


class SteeringBook:
    """Every ordering a request may need, built once from the views (see the module doc)."""

    def __init__(
        self,
        catalogue: Sequence[ModelConfig],
        state: SteeringState,
        chains: Mapping[str, ChainState],
        evidence: Mapping[str, ModelEvidence],
        *,
        degraded: bool,
    ) -> None:
        self.state = state
        self.chains = dict(chains)
        self.degraded = degraded
        self._models = {m.id: m for m in catalogue if m.published}
        enabled = [m for m in self._models.values() if m.catalog.enabled]
        self._enabled = enabled
        self._cap = capability_scores(enabled)
        self._speed = speed_scores(enabled, evidence)
        self._rel = reliability_scores(enabled, evidence)
        self._evidence = evidence
        self.axes = {axis: self._axis(axis) for axis in AXES}
        self.chain_orders = {name: self._priority(c) for name, c in self.chains.items()}
        self.auto = self._auto()

    # -- building -----------------------------------------------------------------------

    def _candidate(self, model: str, weights: tuple[float, float, float] | None) -> Candidate:
        ev = self._evidence.get(model)
        allowance = ev.allowance_multiplier if ev else 1.0
        rate = ev.rate_limit_multiplier if ev else 1.0
        cap = self._cap.get(model, 0.5)
        speed = self._speed.get(model, 0.5)
        rel = self._rel.get(model, 0.5)
        score = None
        if weights is not None:
            score = weighted_score(weights, cap, speed, rel, allowance, rate)
        return Candidate(
            model,
            cap,
            speed,
            rel,
            allowance,
            rate,
            score,
            ev.healthy if ev else True,
            ev.allowance_used if ev else None,
        )

    @staticmethod
    def _healthy_first(cands: list[Candidate]) -> tuple[Candidate, ...]:
        return (*[c for c in cands if c.healthy], *[c for c in cands if not c.healthy])

    def _scored(
        self,
        how: str,
        models: Sequence[str],
        weights: tuple[float, float, float],
        excluded: tuple[tuple[str, str], ...] = (),
    ) -> Ordering:
        cands = [self._candidate(m, weights) for m in models]
        cands.sort(key=lambda c: -(c.score or 0.0))  # stable: ties keep the given order
        return Ordering(how, True, weights, self._healthy_first(cands), excluded)

    def _axis(self, axis: str) -> Ordering:
        ids = [m.id for m in self._enabled]
        disabled = tuple(
            (m, "disabled") for m, cfg in self._models.items() if not cfg.catalog.enabled
        )
        if axis != "cheapest":
            return self._scored(axis, ids, _AXIS_WEIGHTS[axis], disabled)
        cands = [self._candidate(m, None) for m in ids]
        cands.sort(key=lambda c: self._cheapness(c))
        return Ordering(axis, True, None, self._healthy_first(cands), disabled)

    def _cheapness(self, c: Candidate) -> tuple[float, float]:
        return cheapness(self._models[c.model], self._evidence.get(c.model))

    def _chain_members(self, chain: ChainState) -> tuple[list[str], tuple[tuple[str, str], ...]]:
        members: list[str] = []
        excluded: list[tuple[str, str]] = []
        for e in chain.models:
            model = self._models.get(e.model)
            if model is None:
                excluded.append((e.model, "not in the catalogue"))
            elif not model.catalog.enabled:
                excluded.append((e.model, "disabled"))
            elif not e.enabled:
                excluded.append((e.model, "disabled in the chain"))
            else:
                members.append(e.model)
        return members, tuple(excluded)

    def _priority(self, chain: ChainState) -> Ordering:
        members, excluded = self._chain_members(chain)
        cands = [self._candidate(m, None) for m in members]
        return Ordering("priority", False, None, self._healthy_first(cands), excluded)

    def _auto(self) -> Ordering:
        active = self.chains.get(self.state.active_chain or "")
        if active is not None:
            members, excluded = self._chain_members(active)
        else:  # the built-in chain: the whole catalogue, backfilled, in smartest order
            members = [m.id for m in sorted(self._enabled, key=lambda m: -self._cap[m.id])]
            excluded = self.axes["smartest"].excluded
        if self.state.profile == "priority":
            cands = [self._candidate(m, None) for m in members]
            return Ordering("priority", False, None, self._healthy_first(cands), excluded)
        return self._scored(self.state.profile, members, self.state.weights, excluded)

    # -- resolving ----------------------------------------------------------------------

    def visible_chains(self, org: str) -> list[str]:
        """Chains a caller of ``org`` may use: deployment-wide ones and its own."""
        return sorted(n for n, c in self.chains.items() if not c.org or c.org == org)

    def advertised(self, org: str) -> list[str]:
        """The steering ids ``GET /v1/models`` lists for a caller of ``org``."""
        return [
            AUTO,
            *(f"{AUTO}:{a}" for a in AXES),
            *(f"{AUTO}:{n}" for n in self.visible_chains(org)),
        ]

    def ordering(self, name: str, org: str) -> tuple[str, str, str | None, str | None, Ordering]:
        """(target, kind, chain, axis, ordering) of the model field ``name``. Raises
        InvalidRequestError (400) for an unknown chain or one with nothing enabled."""
        target = ascii_lower(name)
        if target == AUTO:
            chain = self.state.active_chain if self.state.active_chain in self.chains else None
            self._not_empty(self.auto, "the active chain" if chain else "the catalogue")
            return target, "auto", chain, None, self.auto
        suffix = target[len(AUTO) + 1 :]
        axis = AXIS_SYNONYMS.get(suffix)
        if axis is not None:
            self._not_empty(self.axes[axis], "the catalogue")
            return target, "axis", None, axis, self.axes[axis]
        chain_state = self.chains.get(suffix)
        if chain_state is None or (chain_state.org and chain_state.org != org):
            raise InvalidRequestError(
                f"unknown chain {bounded(suffix)!r} in model {bounded(name)!r}: no such chain "
                f"(auto:<axis> takes one of {', '.join(AXES)})",
                param="model",
            )
        ordering = self.chain_orders[suffix]
        self._not_empty(ordering, f"chain {suffix!r}")
        return target, "chain", suffix, None, ordering

    def revision(self, kind: str, chain: str | None) -> Hashable:
        """What an operator set that the ordering of a target of ``kind`` (and ``chain``)
        follows: a chain's entries; for ``auto`` also the active chain and the profile; the
        guardrails for every scored ordering. Evidence is not part of it."""
        if kind == "chain":
            return self.chains[chain].models if chain in self.chains else None
        s = self.state
        if kind == "axis":
            return s.guardrails
        active = self.chains.get(s.active_chain or "")
        return (s.active_chain, s.profile, s.weights, s.guardrails, active and active.models)

    @staticmethod
    def _not_empty(ordering: Ordering, what: str) -> None:
        if not ordering.candidates:
            raise InvalidRequestError(f"{what} has no enabled model to route to", param="model")

    def model(self, model_id: str) -> ModelConfig | None:
        """The catalogue entry of ``model_id``."""
        return self._models.get(model_id)


class _Pins:
    """Session affinity of steered conversations: (session, target) -> the model that served
    it and the revision of the operator's settings it was made under; bounded (least
    recently used first out) and expiring after ``ttl`` seconds."""

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._clock = clock
        self._pins: OrderedDict[tuple[str, str], tuple[str, float, Hashable]] = OrderedDict()

    def get(self, session: str, target: str, revision: Hashable) -> str | None:
        """The pinned model, unless the pin expired or the settings changed since."""
        key = (session, target)
        hit = self._pins.get(key)
        if hit is None:
            return None
        if hit[1] <= self._clock() or hit[2] != revision:
            del self._pins[key]
            return None
        return hit[0]

    def pin(self, session: str, target: str, model: str, revision: Hashable) -> None:
        key = (session, target)
        self._pins[key] = (model, self._clock() + self._ttl, revision)
        self._pins.move_to_end(key)
        if len(self._pins) > _PINS_MAX:
            self._pins.popitem(last=False)


class Steerer:
    """Resolves one request's target from the current book, applying the caller's role,
    session affinity and exploration. Owns the steered callers' pins."""

    def __init__(
        self,
        *,
        affinity: bool,
        ttl: float,
        clock: Callable[[], float],
        rng: random.Random | None = None,
    ) -> None:
        self._affinity = affinity
        self._pins = _Pins(ttl, clock)
        self._rng = rng or random.Random()

    def resolve(
        self,
        book: SteeringBook,
        name: str,
        *,
        org: str,
        role: str,
        caller: str,
        conversation: str = "",
        explore: bool = True,
    ) -> Resolution:
        """The Resolution of ``name`` for this caller's ``conversation`` (``explore``: draw
        exploration). A conversation stays on the model that served it while that model is
        healthy and the operator's settings it followed are unchanged. Raises
        InvalidRequestError."""
        target, kind, chain, axis, ordering = book.ordering(name, org)
        models: list[str] = []
        excluded = list(ordering.excluded)
        rank = role_rank(role)
        for c in ordering.candidates:
            need = book.model(c.model)
            if need is not None and need.required_role and rank < role_rank(need.required_role):
                excluded.append((c.model, "role"))
            else:
                models.append(c.model)
        if not models:
            raise InvalidRequestError(
                f"no model of {target!r} is available to your role", param="model"
            )
        healthy = ordering.healthy
        # A pin keeps a conversation where its prompt cache is warm: the caller alone (one
        # address for every anonymous client behind it) is no conversation.
        session = f"{caller}\n{conversation}" if self._affinity and caller and conversation else ""
        revision = book.revision(kind, chain)
        pinned = self._pins.get(session, target, revision) if session else None
        affinity = explored = False
        if pinned is not None and pinned in healthy and pinned in models:
            models.remove(pinned)
            models.insert(0, pinned)
            affinity = True
        elif (
            explore
            and ordering.scored
            and not book.degraded
            and len(models) > 1
            and book.state.exploration > 0
            and self._rng.random() < book.state.exploration
        ):
            others = [m for m in models[1:] if m in healthy]
            if others:
                pick = self._rng.choice(others)
                models.remove(pick)
                models.insert(0, pick)
                explored = True
        return Resolution(
            target,
            kind,
            chain,
            axis,
            ordering,
            tuple(models),
            tuple(excluded),
            explored,
            affinity,
            book.state.exploration if ordering.scored else 0.0,
            book.degraded,
            session=session,
            revision=revision,
        )

    def served(self, res: Resolution, model: str) -> None:
        """``model`` served the steered request ``res``: its conversation stays there."""
        # An explored request is one sample of another model: the caller stays where it was.
        if res.session and not res.explored:
            self._pins.pin(res.session, res.target, model, res.revision)


def book_from(
    catalogue: Sequence[ModelConfig],
    state: SteeringState,
    chains: Mapping[str, ChainState],
    evidence: Evidence | None,
) -> SteeringBook:
    """A SteeringBook of these views."""
    by_model = {e.model: e for e in evidence.models} if evidence else {}
    return SteeringBook(
        catalogue, state, chains, by_model, degraded=bool(evidence and evidence.degraded)
    )
