"""Private batch selection. The sampler that draws batches is the one the accountant accounts for
(DESIGN §4, invariant 3): each sampler wraps a step's mechanism event in the event of its own sampling."""
from __future__ import annotations

from typing import Optional

import dp_accounting
import torch


def _check_size(field: str, size: int, n: int) -> None:
    if not 0 < size <= n:
        raise ValueError(f"sampling.{field}: {size} must be between 1 and the {n} private rows")


class _Sampler:
    size_field = "batch_size"  # the spec field that sets the batch size, for errors

    def __init__(self, n: int, batch_size: int, generator: Optional[torch.Generator]):
        _check_size(self.size_field, batch_size, n)
        self.n = n
        self.expected_batch_size = batch_size
        self.rate = batch_size / n
        self._generator = generator

    def use_generator(self, generator: torch.Generator) -> None:
        """Draw from ``generator`` from now on (an insecure_deterministic run restarts its stream per chunk)."""
        self._generator = generator

    def _private(self) -> torch.Generator:
        # never fall back to torch's global generator: it is public (seeded by anyone)
        if self._generator is None:
            raise RuntimeError(f"{type(self).__name__} was built without a private generator; it cannot draw")
        return self._generator


class PoissonSampler(_Sampler):
    """Each of ``n`` private rows joins a batch independently with probability ``expected_batch_size/n``.

    The selection must stay secret for amplification by subsampling to hold, so it is drawn from a
    private generator (OS entropy), never from the public seed.
    """

    kind = "poisson"
    size_field = "expected_batch_size"

    def sample(self) -> torch.Tensor:
        keep = torch.rand(self.n, generator=self._private(), dtype=torch.float64) < self.rate
        return keep.nonzero().flatten()

    def wrap(self, event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
        """The DpEvent of ``event`` run on one batch drawn by this sampler."""
        return dp_accounting.PoissonSampledDpEvent(self.rate, event)

    def describe(self) -> str:
        return f"Poisson, rate {self.rate:.6g} (expected batch {self.expected_batch_size} of {self.n} private rows)"

    event_phrase = "one Poisson-subsampled Gaussian per step"


class FixedSizeSampler(_Sampler):
    """Exactly ``batch_size`` distinct rows per step, uniformly without replacement, independently across
    steps. The selection is secret (private generator), as amplification needs; dp-accounting accounts for
    it under replace-one neighbours."""

    kind = "fixed_size"

    def sample(self) -> torch.Tensor:
        chosen = torch.randperm(self.n, generator=self._private())[: self.expected_batch_size]
        return chosen.sort().values  # the order carries nothing; sorted like Poisson batches

    def wrap(self, event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
        if self.expected_batch_size == self.n:
            # every row every step: the bare event (dp-accounting's without-replacement bound is looser)
            return event
        return dp_accounting.SampledWithoutReplacementDpEvent(self.n, self.expected_batch_size, event)

    def describe(self) -> str:
        return f"fixed size, {self.expected_batch_size} of {self.n} private rows per step without replacement"

    event_phrase = "one Gaussian on a batch sampled without replacement per step"


class FullBatchSampler(_Sampler):
    """Every private row in every step. Nothing is drawn, so there is nothing to keep secret and no
    amplification: the step's event is the mechanism's own."""

    kind = "full_batch"

    def __init__(self, n: int, generator: Optional[torch.Generator] = None):
        if n < 1:
            raise ValueError("sampling.kind full_batch: there are no private rows")
        super().__init__(n, n, None)  # draws nothing, so holds no generator

    def use_generator(self, generator: torch.Generator) -> None:
        pass

    def sample(self) -> torch.Tensor:
        return torch.arange(self.n)

    def wrap(self, event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
        return event

    def describe(self) -> str:
        return f"full batch, all {self.n} private rows in every step"

    event_phrase = "one Gaussian per step on the full batch (no subsampling)"


def build_sampler(sampling, n: int, generator: Optional[torch.Generator] = None) -> _Sampler:
    """The sampler of a spec's ``sampling`` section over ``n`` private rows. Without a generator it can
    only describe and wrap events (planning and calibration), not draw."""
    if sampling.kind == "poisson":
        return PoissonSampler(n, sampling.expected_batch_size, generator)
    if sampling.kind == "fixed_size":
        return FixedSizeSampler(n, sampling.batch_size, generator)
    if sampling.kind == "full_batch":
        return FullBatchSampler(n)
    raise ValueError(f"sampling.kind: unknown {sampling.kind!r}; allowed: poisson, fixed_size, full_batch")
