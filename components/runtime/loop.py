"""One private step as data flows (DESIGN §3), repeated.

    sampler -> indices -> backend.query (per-example clip, sums) -> accountant records the step's event
    -> mechanism.release (the only private output) -> estimator combines -> backend.apply
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import torch

from components.accountants.accounting import PrivacyTracker
from components.estimators.queries import VectorFiniteDifferences


class PrivacyBudgetError(RuntimeError):
    """An estimator asked for more noisy releases in a step than it declared (and was calibrated for)."""


@dataclass(frozen=True)
class JournalEntry:
    """x_{t+1} = x_t - lr * sum coefficient * u(seed): seeded updates replay from these."""

    step: int
    seed: int
    coefficient: float


class StepContext:
    """What an estimator sees during one step: public facts and ``release``, the only door to private data."""

    def __init__(self, loop: "PrivateLoop", indices: torch.Tensor):
        self.step = loop.step
        self.seed = loop.seed
        self.public = loop.public
        self.batch_normaliser = float(loop.sampler.expected_batch_size)
        self._loop = loop
        self._indices = indices
        self.used = 0
        self.released: List[float] = []

    def release(self, query):
        loop = self._loop
        size = 1 if isinstance(query, VectorFiniteDifferences) else query.size
        if self.used + size > loop.estimator.queries_per_step:
            raise PrivacyBudgetError(
                f"{loop.estimator.name}: {self.used + size} noisy queries in step {self.step}, "
                f"declared {loop.estimator.queries_per_step}")
        sums = loop.backend.query(query, self._indices, loop.mechanism.clip)
        if self.used == 0:
            # recorded before any release exists, so a crash never leaves a release unaccounted
            loop.tracker.record_step()
        self.used += size
        if isinstance(query, VectorFiniteDifferences):
            directions = loop.backend.directions
            vector = [sum(float(w) * directions.tensor(d.seed, i) for w, d in zip(sums, query.directions))
                      for i in range(len(directions.params))]
            return loop.mechanism.release_dense(vector)
        noisy = loop.mechanism.release(sums)
        self.released.extend(float(v) for v in noisy)
        return noisy


@dataclass
class PrivateLoop:
    backend: object
    sampler: object
    estimator: object
    mechanism: object
    tracker: PrivacyTracker
    seed: int
    public: object = None
    step: int = 0
    journal: List[JournalEntry] = field(default_factory=list)
    released: List[Tuple[int, Tuple[float, ...]]] = field(default_factory=list)

    def run(self, until: int, on_step: Optional[Callable[[int], None]] = None) -> None:
        while self.step < until:
            indices = self.sampler.sample()
            ctx = StepContext(self, indices)
            with self.backend.step_scope(self.estimator.direction_seeds(self.step, self.seed)):
                update = self.estimator.step(ctx)
                del indices, ctx._indices
                if ctx.used == 0:
                    raise PrivacyBudgetError(f"{self.estimator.name}: step {self.step} made no private query")
                self.backend.apply(update)
            self.journal.extend(JournalEntry(self.step, s, c) for s, c in update.terms)
            if ctx.released:
                self.released.append((self.step, tuple(ctx.released)))
            self.step += 1
            if on_step is not None:
                on_step(self.step)
