"""One private step as data flows (DESIGN §3), repeated.

    sampler -> indices -> backend.query (per-example clip, sums) -> accountant records the step's event
    -> mechanism.release (the only private output) -> estimator.combine -> backend.apply
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional

from components.accountants.accounting import PrivacyTracker


@dataclass(frozen=True)
class JournalEntry:
    """x_{t+1} = x_t - lr * sum coefficient * u(seed): the trajectory replays from these."""

    step: int
    seed: int
    coefficient: float


@dataclass
class PrivateLoop:
    backend: object
    sampler: object
    estimator: object
    mechanism: object
    tracker: PrivacyTracker
    seed: int
    step: int = 0
    journal: List[JournalEntry] = field(default_factory=list)

    def run(self, until: int, on_step: Optional[Callable[[int], None]] = None) -> None:
        while self.step < until:
            plan = self.estimator.plan(self.step, self.seed)
            indices = self.sampler.sample()
            sums = self.backend.query(plan, indices, self.mechanism.clip)
            # the event is recorded before the release exists, so a crash never leaves a release unaccounted
            self.tracker.record_step()
            noisy = self.mechanism.release(sums)
            del sums, indices
            update = self.estimator.combine(noisy, plan, self.sampler.expected_batch_size)
            self.backend.apply(update)
            self.journal.extend(JournalEntry(self.step, s, c) for s, c in update.terms)
            self.step += 1
            if on_step is not None:
                on_step(self.step)
