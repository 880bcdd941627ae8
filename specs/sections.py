"""The sections of a run spec, one discriminated union on ``kind`` per component kind.

Names follow shared vocabulary: ``privacy.epsilon`` is only ever the DP epsilon; the zeroth-order
perturbation scale is ``smoothing`` (lambda); sigma is ``noise_multiplier``; C is ``clip``; q is
``queries``.
"""
from __future__ import annotations

from typing import Annotated, List, Literal, Optional, Union

from pydantic import Field, PositiveFloat, PositiveInt, field_validator

from specs.base import Auto, Strict

Probability = Annotated[float, Field(gt=0.0, lt=1.0)]


# ---------------------------------------------------------------- data
class SklearnSource(Strict):
    """A dataset bundled inside scikit-learn (works offline)."""

    kind: Literal["sklearn"]
    name: Literal["digits", "breast_cancer", "wine"]
    scale: Literal["auto", "none", "fixed", "public"] = Field(
        "auto",
        description="Feature scaling. 'fixed' uses the known pixel range (digits only); 'public' standardises "
        "with statistics of the public split only; 'auto' = fixed for digits, public otherwise. Never "
        "computed from private rows.",
    )


Source = Annotated[Union[SklearnSource], Field(discriminator="kind")]


class FractionSplit(Strict):
    """Seeded split of the rows into test, public and private parts.

    ``test`` is a fraction of all rows; ``public`` a fraction of the remaining training rows, drawn with
    per-class ratios ``imbalance`` (two values are interpolated linearly across classes, e.g. [1.0, 0.85]
    as in PAZO's CIFAR-10 protocol; or one value per class). The rest is private.
    """

    kind: Literal["fraction"]
    public: float = Field(0.0, ge=0.0, lt=1.0)
    test: Probability = 0.2
    imbalance: Optional[List[Annotated[float, Field(gt=0.0, le=1.0)]]] = None

    @field_validator("imbalance")
    @classmethod
    def _imbalance_length(cls, value):
        if value is not None and len(value) < 2:
            raise ValueError("needs two values (interpolated across classes) or one per class")
        return value


Split = Annotated[Union[FractionSplit], Field(discriminator="kind")]


class DataSpec(Strict):
    source: Source
    split: Split = FractionSplit(kind="fraction")


# ---------------------------------------------------------------- model
class LinearModel(Strict):
    kind: Literal["linear"]


class MlpModel(Strict):
    kind: Literal["mlp"]
    hidden: List[PositiveInt] = Field(default_factory=lambda: [128], min_length=1)
    activation: Literal["relu", "tanh", "gelu"] = "relu"


ModelSpec = Annotated[Union[LinearModel, MlpModel], Field(discriminator="kind")]


# ---------------------------------------------------------------- estimator
class TwoPointEstimator(Strict):
    """DPZero (Algorithm 2 of the DPZero paper, mini-batch form): per-example clipped scalar finite
    differences along q public random directions, one noisy scalar per direction."""

    kind: Literal["two_point"]
    queries: PositiveInt = 1
    smoothing: PositiveFloat = 1e-3
    directions: Literal["gaussian", "sphere", "rademacher"] = "gaussian"
    radius: Union[PositiveFloat, Auto] = Field(
        "auto", description="Sphere radius; 'auto' = sqrt(d) as in DPZero. Only for directions: sphere."
    )


EstimatorSpec = Annotated[Union[TwoPointEstimator], Field(discriminator="kind")]


# ---------------------------------------------------------------- mechanism
class GaussianMechanism(Strict):
    """Per-example clipping to C, then Gaussian noise of std sigma * sensitivity * sqrt(queries)."""

    kind: Literal["gaussian"]
    clip: PositiveFloat
    noise_multiplier: Union[PositiveFloat, Auto] = "auto"


MechanismSpec = Annotated[Union[GaussianMechanism], Field(discriminator="kind")]


# ---------------------------------------------------------------- privacy
class PrivacySpec(Strict):
    epsilon: PositiveFloat = Field(..., description="Target DP epsilon of the whole run.")
    delta: Union[Probability, Auto] = Field("auto", description="'auto' = 1 / number of private rows.")
    accountant: Literal["rdp", "pld"] = "rdp"
    neighboring: Literal["add_remove", "replace_one"] = "add_remove"
    insecure_deterministic: bool = Field(
        False,
        description="Draw DP noise and batch selection from a generator seeded by `seed`. Makes runs "
        "repeatable and NOT private; the run is labelled not private everywhere it is recorded.",
    )


# ---------------------------------------------------------------- sampling
class PoissonSampling(Strict):
    """Each private row joins a batch independently with probability expected_batch_size / n."""

    kind: Literal["poisson"]
    expected_batch_size: PositiveInt = 64


SamplingSpec = Annotated[Union[PoissonSampling], Field(discriminator="kind")]


# ---------------------------------------------------------------- optimizer
class SgdOptimizer(Strict):
    kind: Literal["sgd"]
    lr: PositiveFloat
    momentum: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    epochs: Optional[PositiveFloat] = Field(None, description="Passes over the private data (in expectation).")
    steps: Union[PositiveInt, Auto] = Field("auto", description="'auto' = ceil(epochs * n_private / batch).")


OptimizerSpec = Annotated[Union[SgdOptimizer], Field(discriminator="kind")]


# ---------------------------------------------------------------- execution and tracking
class ExecutionSpec(Strict):
    backend: Literal["local"] = "local"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: Optional[PositiveInt] = Field(None, description="torch intra-op threads; default: torch's choice.")


class TrackingSpec(Strict):
    uri: str = Field("sqlite:///mlflow.db", min_length=1)
    experiment: Optional[str] = Field(None, description="MLflow experiment; default: the spec name.")
    log_every: PositiveInt = Field(50, description="Steps between metric points (epsilon, eval).")
