"""What every algorithm family plans with: the spec's accountant and its sampler (described, or drawing).

Families import this module, never components/builders.py, so the import graph has no circle."""
from __future__ import annotations

from typing import Optional

import torch

from components.accountants import Accountant
from components.data.sampling import PersonSampler, build_sampler


def accountant(spec) -> Accountant:
    if spec.privacy is None:
        return Accountant("rdp", "add_remove")  # non-private runs: only NonPrivateDpEvent (epsilon = inf)
    return Accountant(spec.privacy.accountant, spec.privacy.neighboring)


def spec_sampler(spec, n_private: Optional[int] = None, generator: Optional[torch.Generator] = None,
                 persons=None):
    """The spec's sampler over ``n_private`` rows, its rate from the public row count (RunSpec.public_rows):
    under add/remove that is the declared count, and ``n_private`` only says which rows exist to draw from
    (planning passes None). Without a generator it can only describe and wrap events, not draw.
    ``persons`` (a person-level run's private rows' persons): it samples persons at expected_batch_size / N,
    N the declared persons, and draws every row of each sampled person; planned, it is the same event."""
    if spec.person_level:
        return PersonSampler(persons, spec.sampling.expected_batch_size, spec.public_rows(n_private), generator)
    return build_sampler(spec.sampling, n_private, generator, rows=spec.public_rows(n_private), seed=spec.seed)


def calibrate_sigma(spec, n_private: Optional[int], planned_event) -> float:
    """sigma for the whole planned run, ``planned_event(spec, n_private, sigma)`` its event (dp-accounting's
    calibration with a fresh accountant per probe; never less privacy than asked)."""
    return accountant(spec).calibrate(lambda sigma: planned_event(spec, n_private, sigma), spec.privacy.epsilon,
                                      spec.delta_for(n_private))
