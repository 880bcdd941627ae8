"""The ``optimizer`` section: how the released estimate moves the parameters and for how long, the
theory presets' spec classes, and the constants those presets hide."""
from __future__ import annotations

from typing import Annotated, Dict, List, Literal, Optional, Union

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from specs.base import Auto, Strict


class _Schedule(Strict):
    """How long a run is and where it starts, whatever the optimizer."""

    epochs: Optional[PositiveFloat] = Field(None, description="Passes over the private data (in expectation).")
    steps: Union[PositiveInt, Auto] = Field("auto", description="'auto' = ceil(epochs * n_private / batch).")
    init: Literal["seed", "latest_registered"] = Field(
        "seed", description="seed: the public initialisation drawn from seed; latest_registered: the latest "
        "version of the MLflow registered model named like this spec (scheduled retraining), or the seed "
        "initialisation when none is registered yet.")


class SgdOptimizer(_Schedule):
    """SGD with momentum and coupled (L2) weight decay; without momentum nothing d-sized is kept."""

    kind: Literal["sgd"]
    lr: PositiveFloat
    momentum: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)


class AdamOptimizer(_Schedule):
    """Adam with decoupled weight decay (torch.optim.AdamW) on the estimator's update, as DP-Adam does:
    the moments are computed from released (noisy) values only, so they cost no privacy. Keeps two
    d-sized moments."""

    kind: Literal["adam"]
    lr: PositiveFloat
    betas: List[float] = Field(default_factory=lambda: [0.9, 0.999], min_length=2, max_length=2,
                               description="Decay rates of the first and second moments, each in [0, 1).")
    eps: PositiveFloat = 1e-8
    weight_decay: float = Field(0.0, ge=0.0, description="Decoupled (AdamW): x <- x - lr * weight_decay * x.")

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, value):
        if not all(0.0 <= b < 1.0 for b in value):
            raise ValueError("each must be in [0, 1)")
        return value


# the constants hidden in the theorems of the improved nonsmooth algorithm (Kornowski et al.), which preset
# theory_shape exposes
O2NC_CONSTANTS = ("c_D", "c_Sigma", "c_T", "c_h", "c_s")


class O2ncOptimizer(_Schedule):
    """O2NC (online-to-nonconvex conversion), as the original and improved nonsmooth algorithms (Zhang et al.,
    Kornowski et al.) run it: projected online gradient descent on the ball of radius D picks each move, the
    oracle is queried a public random fraction along it, and the output is the average of the query points of
    a window drawn from the seed (what the theorems bound). preset theory derives every auto below from the
    theorems (n, d, the assumptions, the radius and the privacy target); theory_shape does the same with the
    constants the theorems hide (each 1 under theory) set in ``constants``; manual takes them as given."""

    kind: Literal["o2nc"]
    preset: Literal["theory", "theory_shape", "manual"] = "theory"
    constants: Dict[str, PositiveFloat] = Field(
        {}, description="preset theory_shape: the theorems' hidden constants, each 1 unless given. Kornowski et "
        "al.'s: c_D (scales D), c_Sigma (Sigma, single pass), c_T (T, multi-pass), c_h (the concentration clips' "
        "constant) and c_s (the smoothness constant in C_Delta). Privacy never rests on them: the noise is "
        "calibrated on the clips they set.")
    step_bound: Union[PositiveFloat, Auto] = Field("auto", description="D: the largest move a step.")
    lr: Union[PositiveFloat, Auto] = Field("auto", description="eta = D / (G sqrt(W)).")
    window: Union[PositiveInt, Auto] = Field("auto", description="W: query points averaged into a candidate "
                                             "output (variant original: an epoch of T steps; "
                                             "improved: alpha / (4D)).")
    restart: Union[bool, Auto] = Field("auto", description="Reset the move at each window's start "
                                        "(the original algorithm's epochs).")
    target_stationarity: Optional[PositiveFloat] = Field(
        None, description="With preset theory: refuse a spec whose n cannot reach this bound on the Goldstein "
        "subgradient norm at 2r by the theorem, naming the n it would need.")

    @model_validator(mode="after")
    def _constants_are_known(self):
        unknown = sorted(set(self.constants) - set(O2NC_CONSTANTS))
        if unknown:
            raise ValueError(f"constants: unknown {unknown[0]!r}; allowed: {', '.join(O2NC_CONSTANTS)}")
        if self.constants and self.preset != "theory_shape":
            raise ValueError(f"constants: only with preset theory_shape (preset {self.preset} "
                             + ("takes the theorems' constants as 1)" if self.preset == "theory" else "derives nothing)"))
        return self


# the constants the KL paper's presets hide (Menart et al.): KL-Spider's phase count (64) and noise floor (32),
# the proximal point method's outer steps (32)
KL_CONSTANTS = {"kl_spider": ("c_K", "c_floor"), "proximal_point": ("c_T",), "adaptive_noisy_gd": ()}


class _KlPreset(_Schedule):
    preset: Literal["theory", "theory_shape"] = "theory"
    constants: Dict[str, PositiveFloat] = Field(
        {}, description="preset theory_shape: the paper's constants, each 1 unless given (kl_spider: c_K, "
        "c_floor; proximal_point: c_T). Privacy never rests on them: the noise is calibrated on the plan.")

    @model_validator(mode="after")
    def _constants_are_known(self):
        allowed = KL_CONSTANTS[self.kind]
        unknown = sorted(set(self.constants) - set(allowed))
        if unknown:
            raise ValueError(f"constants: unknown {unknown[0]!r}; allowed: {', '.join(allowed) or 'none'}")
        if self.constants and self.preset != "theory_shape":
            raise ValueError("constants: only with preset theory_shape (preset theory takes the paper's)")
        return self


class KlSpiderOptimizer(_KlPreset):
    """The KL paper's KL-Spider (Menart et al., Algorithm 1, kappa in [1, 2], smooth losses): phases of
    shrinking target excess risk, each a noisy full gradient then noisy gradient differences, normalised steps
    of a fixed length, and a phase ends early once the estimated gradient is small. Every setting follows from
    n, d, the privacy target and the assumptions (preset theory: the paper's constants 64 and 32;
    theory_shape: 1 each)."""

    kind: Literal["kl_spider"]


class ProximalPointOptimizer(_KlPreset):
    """The KL paper's private proximal point method (Menart et al., Algorithm 2, kappa >= 2, weakly convex
    losses): each outer step solves F(w) + L~1 |w - w_prev|^2 with projected noisy GD (Algorithm 4: steps 1 /
    (L~1 s), a ball of radius L0 / (2 L~1), the s-weighted average)."""

    kind: Literal["proximal_point"]
    log_factor: bool = Field(True, description="Keep Theorem 9's log^2(2 / beta') in the inner steps (theory_shape "
                             "may drop it: n^2 rho / d inner steps).")


class AdaptiveNoisyGdOptimizer(_Schedule):
    """The KL paper's adaptive noisy GD (Menart et al., Algorithm 3): step 1 / (2 L1), each step's noise
    proportional to a privately estimated gradient norm, run until the privacy filter's budget is spent; needs
    no KL parameter. select: last outputs w_T (Theorem 4); exponential picks an iterate by the exponential
    mechanism on its clipped gradient norm (Theorem 5, stationary points), charged as its own event."""

    kind: Literal["adaptive_noisy_gd"]
    select: Literal["last", "exponential"] = "last"
    lr: Union[PositiveFloat, Auto] = Field("auto", description="eta (auto: 1 / (2 L1)).")


OptimizerSpec = Annotated[Union[SgdOptimizer, AdamOptimizer, O2ncOptimizer, KlSpiderOptimizer, ProximalPointOptimizer,
                                AdaptiveNoisyGdOptimizer], Field(discriminator="kind")]
