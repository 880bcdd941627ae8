"""Private batch selection. The sampler that draws batches is the one the accountant accounts for
(docs/design.md, "Privacy invariants" 3): each sampler wraps a step's mechanism event in the event of its own sampling.

Every sampler is a components.protocols.Sampler, and either draws RandomBatches (``sample``: Poisson, fixed size,
full batch) or follows ScheduledBatches (``batch_at`` and ``sample_at``: a single pass)."""
from __future__ import annotations

from typing import Optional, Union

import dp_accounting
import numpy as np
import torch

from components.protocols import Sampler
from components.randomness import SecureSource
from components.registry import SAMPLERS

# a torch generator (fast, or seeded in tests), or the CSPRNG of privacy.noise: secure
Private = Union[torch.Generator, SecureSource]


def _check_size(field: str, size: int, n: Optional[int]) -> None:
    if n is None:
        raise ValueError(f"sampling.{field}: this sampler needs the number of private rows (public under replace-one)")
    if not 0 < size <= n:
        raise ValueError(f"sampling.{field}: {size} must be between 1 and the {n} private rows")


class _Sampler:
    size_field = "batch_size"  # the spec field that sets the batch size, for errors

    def __init__(self, n: int, batch_size: int, generator: Optional[torch.Generator]):
        _check_size(self.size_field, batch_size, n)
        self.n = n
        self.expected_batch_size = batch_size
        self.rate = batch_size / n
        self.rows = n  # the row count the accounting and the report use (public under replace-one)
        self._generator = generator

    def use_generator(self, generator: torch.Generator) -> None:
        """Draw from ``generator`` from now on (an insecure_deterministic run restarts its stream per chunk)."""
        self._generator = generator

    def _private(self) -> Private:
        # never fall back to torch's global generator: it is public (seeded by anyone)
        if self._generator is None:
            raise RuntimeError(f"{type(self).__name__} was built without a private generator; it cannot draw")
        return self._generator


class PoissonSampler(_Sampler):
    """Each of the ``n`` private rows joins a batch independently with probability
    ``expected_batch_size / rows``, where ``rows`` is a public constant of the run (the declared number of
    private rows), never the private count: under add/remove neighbours a rate of b/n moves with the added
    row, and the release's mean then moves by up to 2C where the accountant assumes C. The rate, and so
    the accounted event, are the same for every neighbouring dataset; ``n`` only says which rows exist.

    The selection must stay secret for amplification by subsampling to hold, so it is drawn from a
    private generator (OS entropy), never from the public seed.
    """

    kind = "poisson"
    size_field = "expected_batch_size"

    def __init__(self, n: Optional[int], expected_batch_size: int, rows: int, generator: Optional[torch.Generator]):
        if not 0 < expected_batch_size <= rows:
            raise ValueError(f"sampling.expected_batch_size: {expected_batch_size} must be between 1 and the "
                             f"{rows} declared private rows (data.declared_private_rows)")
        self.n = n
        self.expected_batch_size = expected_batch_size
        self.rows = rows
        self.rate = expected_batch_size / rows
        self._generator = generator

    def sample(self) -> torch.Tensor:
        if self.n is None:
            raise RuntimeError("PoissonSampler was built for planning (no rows); it cannot draw")
        gen = self._private()
        if isinstance(gen, SecureSource):
            # exact Bernoulli(rate) per row from secrets: torch.rand's 53-bit floats only approximate it
            return gen.members(self.n, self.rate)
        keep = torch.rand(self.n, generator=gen, dtype=torch.float64) < self.rate
        return keep.nonzero().flatten()

    def wrap(self, event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
        """The DpEvent of ``event`` run on one batch drawn by this sampler."""
        return dp_accounting.PoissonSampledDpEvent(self.rate, event)

    def describe(self) -> str:
        return f"Poisson, rate {self.rate:.6g} (expected batch {self.expected_batch_size} of {self.rows} declared rows)"

    event_phrase = "one Poisson-subsampled Gaussian per step"


class PersonSampler(PoissonSampler):
    """Person level: each person joins a batch independently with probability ``expected_batch_size /
    persons_declared`` (a public constant, never the count of persons), and brings every one of their rows.
    The backend sums each sampled person's rows before clipping, so one person moves a release by at most
    the clip: adding or removing a person is then exactly adding or removing one Poisson-sampled unit of
    sensitivity C, the event ``wrap`` gives (the same as PoissonSampler's over persons). ``persons``: the
    person of each private row, as integers; None for planning (it then only describes and wraps events)."""

    def __init__(self, persons, expected_batch_size: int, persons_declared: int, generator: Optional[torch.Generator]):
        if not 0 < expected_batch_size <= persons_declared:
            raise ValueError(f"sampling.expected_batch_size: {expected_batch_size} must be between 1 and the "
                             f"{persons_declared} declared persons (data.blocks.declared_persons x the window)")
        codes = None if persons is None else torch.as_tensor(
            np.unique(np.asarray(persons), return_inverse=True)[1].reshape(-1), dtype=torch.long)
        n = None if codes is None else (int(codes.max()) + 1 if len(codes) else 0)
        super().__init__(n, expected_batch_size, persons_declared, generator)
        self._codes = codes

    def sample(self) -> torch.Tensor:
        chosen = torch.zeros(max(self.n, 1), dtype=torch.bool)
        chosen[super().sample()] = True
        return chosen[self._codes].nonzero().flatten()  # the rows of every sampled person, in row order

    def describe(self) -> str:
        return (f"Poisson over persons, rate {self.rate:.6g} (expected {self.expected_batch_size} of {self.rows} "
                "declared persons), every row of a sampled person, each person's sum clipped")

    event_phrase = "one Poisson-subsampled Gaussian over persons per step"


class FixedSizeSampler(_Sampler):
    """Exactly ``batch_size`` distinct rows per step, uniformly without replacement, independently across
    steps. The selection is secret (private generator), as amplification needs; dp-accounting accounts for
    it under replace-one neighbours."""

    kind = "fixed_size"

    def sample(self) -> torch.Tensor:
        gen = self._private()
        if isinstance(gen, SecureSource):
            return gen.subset(self.n, self.expected_batch_size)  # sorted already
        chosen = torch.randperm(self.n, generator=gen)[: self.expected_batch_size]
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


class SinglePassSampler:
    """Each private row is read at most once: a single pass in an order drawn from the public seed. Batches
    come in periods (the tree mechanism's): ``start_batch`` rows at a period's first step, ``step_batch``
    at each other; a constant schedule is a period of one step.

    No amplification by subsampling is claimed (each row's privacy comes from the noise on the releases it
    is in), so the order needs no secrecy, and drawing it from the seed lets a resumed run find its place.
    Which rows a step reads is a function of how many private steps were ever executed (``spent``), not
    of the step number: a run rewound to a period boundary, or resumed after a crash, reads fresh rows for
    every step it runs again. A period whose steps were discarded is burned whole (the privacy tracker
    rounds ``spent`` up), so no row is ever in two of a run's trees."""

    kind = "single_pass"
    rate = 1.0  # every row is used (once); nothing is subsampled

    def __init__(self, n: int, start_batch: int, step_batch: int, period: int, seed: int):
        from components.randomness import STREAM_PASS, public_seed

        if not (start_batch >= 1 and step_batch >= 1 and period >= 1):
            raise ValueError("sampling: start_batch, step_batch and period must be >= 1")
        if n is None or n < start_batch:
            raise ValueError(f"sampling.start_batch: {start_batch} rows, more than the {n} private rows")
        self.n = self.rows = n
        self.start_batch, self.step_batch, self.period = int(start_batch), int(step_batch), int(period)
        self.expected_batch_size = self.step_batch
        self.block = self.start_batch + (self.period - 1) * self.step_batch  # rows a period reads
        gen = torch.Generator().manual_seed(public_seed(seed, STREAM_PASS))
        self._order = torch.randperm(n, generator=gen)

    def use_generator(self, generator) -> None:
        pass  # draws nothing private

    def batch_at(self, step: int) -> int:
        return self.start_batch if step % self.period == 0 else self.step_batch

    def rows_for(self, steps: int) -> int:
        """Rows that ``steps`` steps from a period boundary read."""
        full, rest = divmod(steps, self.period)
        return full * self.block + (0 if rest == 0 else self.start_batch + (rest - 1) * self.step_batch)

    def sample_at(self, step: int, spent: int) -> torch.Tensor:
        """Step ``step``'s rows when ``spent`` private steps were executed before it (at a period's start
        ``spent`` is a whole number of periods)."""
        position = step % self.period
        start = (spent - position) // self.period * self.block + self.rows_for(position)
        size = self.batch_at(step)
        if start + size > self.n:
            raise RuntimeError(f"single pass: step {step} needs rows {start}..{start + size} of {self.n}; the pass "
                               "is used up (steps discarded by retries burn their period's rows)")
        return self._order[start:start + size].sort().values

    def wrap(self, event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
        return event  # accounted by the tree's (or the once-per-row Gaussian's) event, not per step

    def describe(self) -> str:
        if self.period == 1:
            return f"single pass, {self.step_batch} fresh rows a step, each of the {self.n} private rows used at most once"
        return (f"single pass, {self.start_batch} rows at each period start and {self.step_batch} at its other "
                f"{self.period - 1} steps, each of the {self.n} private rows used at most once")

    event_phrase = "each row in one period of one tree"


def build_sampler(sampling, n: Optional[int], generator: Optional[torch.Generator] = None, *,
                  rows: Optional[int] = None, seed: int = 0) -> Sampler:
    """The sampler of a spec's ``sampling`` section over ``n`` private rows. ``rows``: the public row count
    Poisson's rate is taken from (the declared number of private rows; default ``n``, which is public only
    under replace-one neighbours or in a non-private run). Without a generator it can only describe and
    wrap events (planning and calibration), not draw."""
    return SAMPLERS[sampling.kind](sampling, n, generator, rows=rows, seed=seed)


@SAMPLERS.register("poisson")
def _poisson(sampling, n, generator=None, rows=None, seed=0):
    return PoissonSampler(n, sampling.expected_batch_size, n if rows is None else rows, generator)


@SAMPLERS.register("fixed_size")
def _fixed_size(sampling, n, generator=None, rows=None, seed=0):
    return FixedSizeSampler(n, sampling.batch_size, generator)


@SAMPLERS.register("full_batch")
def _full_batch(sampling, n, generator=None, rows=None, seed=0):
    return FullBatchSampler(n)


@SAMPLERS.register("single_pass")
def _single_pass(sampling, n, generator=None, rows=None, seed=0):
    return SinglePassSampler(n, sampling.start_batch, sampling.step_batch, sampling.period, seed)
