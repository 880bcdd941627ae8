"""The ``sampling`` section: which private rows each step reads."""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, PositiveInt

from specs.base import Auto, Strict


class PoissonSampling(Strict):
    """Each private row joins a batch independently with probability expected_batch_size / n."""

    kind: Literal["poisson"]
    expected_batch_size: PositiveInt = 64


class FixedSizeSampling(Strict):
    """Each step draws exactly ``batch_size`` distinct private rows, uniformly without replacement and
    independently of other steps. dp-accounting's RDP accounts for it under replace-one neighbours only
    (the dataset size is public), so it needs ``privacy.neighboring: replace_one`` and ``accountant: rdp``."""

    kind: Literal["fixed_size"]
    batch_size: PositiveInt = 64


class FullBatchSampling(Strict):
    """Every private row in every step: no amplification by subsampling, one step per epoch (full-batch
    noisy gradient descent, as the theory papers analyse it). A step is normalised by the number of rows,
    which must then be public: it needs ``privacy.neighboring: replace_one``."""

    kind: Literal["full_batch"]


class SinglePassSampling(Strict):
    """Each private row is read at most once, in an order drawn from the seed (no amplification is claimed,
    so the order needs no secret): ``start_batch`` rows at each tree period's first step, ``step_batch`` at
    the others (a constant schedule: period 1). Needs privacy.neighboring replace_one (the batches are a
    fixed partition). A step rerun after a crash reads fresh rows; a period cut short is not read again."""

    kind: Literal["single_pass"]
    start_batch: Union[PositiveInt, Auto] = Field("auto", description="B1 (variant original: T + 1; improved: Sigma).")
    step_batch: PositiveInt = Field(1, description="B2: rows of every other step.")
    period: Union[PositiveInt, Auto] = Field("auto", description="Steps per tree period (variant original: T, "
                                             "an epoch; improved: Sigma); 1 with a Gaussian mechanism.")


SamplingSpec = Annotated[Union[PoissonSampling, FixedSizeSampling, FullBatchSampling, SinglePassSampling],
                         Field(discriminator="kind")]


def batch_size_of(sampling, n_private: int) -> int:
    """Rows in a step: expected for Poisson, exact for fixed-size and full-batch sampling."""
    if sampling.kind == "poisson":
        return sampling.expected_batch_size
    if sampling.kind == "fixed_size":
        return sampling.batch_size
    if sampling.kind == "single_pass":
        return sampling.step_batch
    return n_private
