"""Private batch selection. The sampler that draws batches is the one the accountant accounts for."""
from __future__ import annotations

import dp_accounting
import torch


class PoissonSampler:
    """Each of ``n`` private rows joins a batch independently with probability ``expected_batch_size/n``.

    The selection must stay secret for amplification by subsampling to hold, so it is drawn from a
    private generator (OS entropy), never from the public seed.
    """

    def __init__(self, n: int, expected_batch_size: int, generator: torch.Generator):
        if not 0 < expected_batch_size <= n:
            raise ValueError(
                f"sampling.expected_batch_size: {expected_batch_size} must be between 1 and the {n} private rows"
            )
        self.n = n
        self.expected_batch_size = expected_batch_size
        self.rate = expected_batch_size / n
        self._generator = generator

    def use_generator(self, generator: torch.Generator) -> None:
        """Draw from ``generator`` from now on (an insecure_deterministic run restarts its stream per chunk)."""
        self._generator = generator

    def sample(self) -> torch.Tensor:
        keep = torch.rand(self.n, generator=self._generator, dtype=torch.float64) < self.rate
        return keep.nonzero().flatten()

    def wrap(self, event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
        """The DpEvent of ``event`` run on one batch drawn by this sampler."""
        return dp_accounting.PoissonSampledDpEvent(self.rate, event)
