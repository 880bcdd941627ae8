"""The ``estimator`` section: how a step's (zeroth- or first-order) gradient estimate is formed from the
private batch, one ``kind`` per oracle.

The private nonsmooth oracles (zo_spider, fo_spider, zo_naive) come from two papers: the original nonsmooth
algorithm, "Private Zeroth-Order Nonsmooth Nonconvex Optimization" (Zhang, Tran and Cutkosky, ICLR 2024),
and the improved nonsmooth algorithm, "Improved Sample Complexity for Private Nonsmooth Nonconvex
Optimization" (Kornowski, Liu and Talwar). full_gradient is the oracle of the KL paper, "Differentially
Private Non-Convex Optimization under the KL Condition with Optimal Rates" (Menart et al.).
"""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal, Optional, Union

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from specs.base import Auto, Strict


class PublicWarmStart(Strict):
    """Plain (non-private) training on the public split before the private phase; costs no privacy."""

    epochs: PositiveFloat = 5.0
    lr: PositiveFloat = 0.1
    batch_size: PositiveInt = 32


class _ZerothOrder(Strict):
    queries: PositiveInt = Field(1, description="q: directions queried per step, all on the same private batch.")
    smoothing: PositiveFloat = Field(1e-3, description="lambda: the finite-difference perturbation scale.")
    perturbation: Literal["auto", "regenerate", "cache"] = Field(
        "auto", description="regenerate: directions re-drawn from their seeds each use (no d-sized memory); "
        "cache: drawn once per step, forwards on a perturbed copy (+(q+1)*d memory at most, one RNG pass); "
        "auto: cache when that fits in 512 MiB.")
    public_warm_start: Optional[PublicWarmStart] = None


class _RandomDirections(_ZerothOrder):
    directions: Literal["gaussian", "sphere", "rademacher"] = "gaussian"
    radius: Union[PositiveFloat, Auto] = Field(
        "auto", description="Sphere radius (directions: sphere only); 'auto' = sqrt(d), or d^(1/4) for pazo_m.")


class TwoPointEstimator(_RandomDirections):
    """DPZero (Algorithm 2 of the DPZero paper, mini-batch form): per-example clipped scalar finite
    differences along q public random directions, one noisy scalar per direction. MeZO with
    ``mechanism.kind: none``."""

    kind: Literal["two_point"]


class DpgdZerothEstimator(_RandomDirections):
    """DPGD-0th (Algorithm 1 of DPZero): the d-dimensional zeroth-order estimate is clipped in L2 norm per
    example and gets d-dimensional noise."""

    kind: Literal["dpgd_0th"]


class PazoMEstimator(_RandomDirections):
    """PAZO-M (Algorithm 1 of PAZO): mix alpha of a public mini-batch gradient and the private two-point
    estimate along directions on the sphere of radius d^(1/4)."""

    kind: Literal["pazo_m"]
    directions: Literal["gaussian", "sphere", "rademacher"] = "sphere"
    mix: float = Field(0.5, ge=0.0, le=1.0, description="alpha: weight of the public gradient.")
    public_batch_size: PositiveInt = 32


class PazoPEstimator(_ZerothOrder):
    """PAZO-P (Algorithm 2 of PAZO): directions u on sqrt(k) S^(k-1) in the span of k public gradients,
    perturbation lambda * G u."""

    kind: Literal["pazo_p"]
    public_batches: PositiveInt = Field(3, description="k: public gradients spanning the subspace.")
    public_batch_size: PositiveInt = 32
    basis: Literal["orthonormal", "normalized"] = "orthonormal"


class PazoSEstimator(Strict):
    """PAZO-S (Algorithm 3 of PAZO): k public-gradient candidates plus one perturbed copy of the best,
    scored by privatized clipped private losses; step along the argmin."""

    kind: Literal["pazo_s"]
    public_batches: PositiveInt = Field(3, description="k: candidates from k distinct public batches.")
    public_batch_size: PositiveInt = 32
    candidate_noise: float = Field(1e-3, ge=0.0, description="Std of the extra candidate's perturbation (0: none).")
    public_warm_start: Optional[PublicWarmStart] = None


class FirstOrderEstimator(Strict):
    """DP-SGD (Abadi et al. 2016): per-example gradients by backprop (torch.func), each clipped to L2 norm
    ``mechanism.clip``, summed, plus d-dimensional Gaussian noise. Not forward-only: the first-order
    baseline to measure the zeroth-order estimators against (the PAZO and DPZero papers' DP-SGD rows)."""

    kind: Literal["first_order"]
    public_warm_start: Optional[PublicWarmStart] = None


class GepEstimator(Strict):
    """GEP (Yu et al. 2021), a first-order baseline guided by public data: each private per-example
    gradient is split by the top-k subspace of b' public per-example gradients into a k-dimensional
    embedding (clipped to ``mechanism.clip``) and a residual (clipped to ``residual_clip``); both are
    noised, together one Gaussian query per step. Not forward-only, and the anchors hold b' x d numbers
    (with a transformer, train the head, biases or LoRA adapters)."""

    kind: Literal["gep"]
    anchors: PositiveInt = Field(16, description="k: dimension of the anchor subspace (at most public_batch_size).")
    public_batch_size: PositiveInt = Field(32, description="b': public rows whose gradients span the subspace, "
                                           "drawn afresh each step.")
    residual_clip: Optional[PositiveFloat] = Field(None, description="C2: per-example L2 clip of the residual; "
                                                   "default: mechanism.clip.")
    embedding_share: float = Field(0.5, gt=0.0, lt=1.0, description="s: the embedding's share of the step's "
                                   "privacy (its noise std is sigma C1 / sqrt(s), the residual's sigma C2 / "
                                   "sqrt(1 - s)); 0.5 gives both the same noise multiplier, as the paper.")
    public_warm_start: Optional[PublicWarmStart] = None

    @model_validator(mode="after")
    def _anchors_fit(self):
        if self.anchors > self.public_batch_size:
            raise ValueError(f"anchors ({self.anchors}) cannot exceed public_batch_size ({self.public_batch_size}): "
                             "the subspace is spanned by that many public gradients")
        return self


class DopeSgdEstimator(Strict):
    """DOPE-SGD's gradient step (Nasr et al. 2023), a first-order baseline guided by public data: each
    private per-example gradient is clipped to ``mechanism.clip`` around the mean gradient of b' public
    rows instead of around the origin, summed and noised as DP-SGD's, and the public gradient is added
    back. Same release and accounting as first_order. The paper's synthetic-data augmentation and model
    averaging are not part of it. Not forward-only."""

    kind: Literal["dope_sgd"]
    public_batch_size: PositiveInt = Field(32, description="b': public rows whose mean gradient is the clip "
                                           "center, drawn afresh each step.")
    public_warm_start: Optional[PublicWarmStart] = None


class PdaDpmdEstimator(Strict):
    """PDA-DPMD (Amid et al. 2022), public-data-assisted mirror descent in its first-order form for deep
    models: a DP-SGD step mixed with the mean gradient of b' public rows, the private weight
    a_t = cos(pi t / 2T) falling from 1 to 0 over the T planned steps. Same release and accounting as
    first_order. Not forward-only."""

    kind: Literal["pda_dpmd"]
    public_batch_size: PositiveInt = Field(32, description="b': public rows whose mean gradient is mixed in, "
                                           "drawn afresh each step.")
    public_warm_start: Optional[PublicWarmStart] = None


# zo_spider's former variant names, still read (specs written before the rename)
VARIANT_ALIASES = {"001": "original", "002": "improved"}


class ZoSpiderEstimator(Strict):
    """The variance-reduced zeroth-order oracle of the private nonsmooth algorithms, run with O2NC and the
    tree mechanism. At each tree period's first step: the smoothed gradient at the query point from
    ``sampling.start_batch`` rows; after: its difference between consecutive query points from
    ``step_batch`` fresh rows. Every row gets its own directions on the sphere of radius sqrt(d), lambda =
    radius / sqrt(d). variant original (the original nonsmooth algorithm, Zhang, Tran and Cutkosky, "Private
    Zeroth-Order Nonsmooth Nonconvex Optimization", Algorithms 1-2 and 4): d directions per row, central
    estimate, coupled one-sided difference, every coefficient clipped. variant improved (the improved
    nonsmooth algorithm, Kornowski, Liu and Talwar, "Improved Sample Complexity for Private Nonsmooth
    Nonconvex Optimization", Algorithm 3): the per-example vectors clipped in L2, a difference's two points
    on independent directions as the paper has it, or (``coupling: coupled``) on the same ones, a deviation
    from the paper that makes the run feasible: the paper's m = log(8 d B / delta_0)(d^2 B1^2 + d alpha^2
    B2^2 / D^2) directions per row is 1e5-1e8, the coupled difference's concentration needs m_D = 4 d
    log(8 d / delta_0)."""

    kind: Literal["zo_spider"]
    variant: Literal["original", "improved"] = Field(
        ..., description="original: the original nonsmooth algorithm (Zhang et al.); improved: the improved one "
        "(Kornowski et al.). \"001\" and \"002\", their former names, are read as original and improved.",
        json_schema_extra={"enum": ["original", "improved", *VARIANT_ALIASES]})
    coupling: Literal["independent", "coupled"] = Field(
        "independent", description="variant improved: the directions of a difference's two points, independent "
        "(Kornowski et al.'s m directions per row) or coupled (the same m_D at both: a deviation from the paper, "
        "feasible where its m is not). Variant original's difference is coupled by Zhang et al. (the default "
        "there).")
    radius: PositiveFloat = Field(..., description="r: the smoothing radius (the guarantee is Goldstein "
                                  "stationarity at 2r).")
    start_directions: Union[PositiveInt, Auto] = Field("auto", description="Directions per row at a period's start "
                                                       "(original: d; improved: Kornowski et al.'s m, or coupled "
                                                       "m_G = d^2 log(8 d B1 / delta_0)).")
    directions: Union[PositiveInt, Auto] = Field("auto", description="Directions per row of a difference "
                                                 "(original: d; improved: Kornowski et al.'s m at each point, or "
                                                 "coupled m_D = 4 d log(8 d / delta_0) shared by both).")
    period: Union[PositiveInt, Auto, None] = Field(
        None, description="variant improved with sampling.kind full_batch or poisson (the multi-pass algorithm): "
        "steps between restarts, Sigma (auto: Theorem 4.1). A single pass takes sampling.period.")

    @field_validator("variant", mode="before")
    @classmethod
    def _former_names(cls, value):
        return VARIANT_ALIASES.get(value, value) if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _coupling_of_original(cls, data):
        variant = data.get("variant") if isinstance(data, dict) else None
        if isinstance(variant, str) and VARIANT_ALIASES.get(variant, variant) == "original" and "coupling" not in data:
            return {**data, "coupling": "coupled"}  # Zhang et al.'s one-sided difference shares its directions
        return data

    @model_validator(mode="after")
    def _coupling_fits_variant(self):
        if self.variant == "original" and self.coupling != "coupled":
            raise ValueError("coupling: in the original nonsmooth algorithm of Zhang et al. a difference evaluates "
                             "both points on the same directions; independent directions are the improved "
                             "algorithm's (Kornowski et al.; variant: improved)")
        return self


class FoSpiderEstimator(Strict):
    """The improved nonsmooth algorithm's first-order oracle (Kornowski et al., Algorithm 5, Theorem 6.1) on
    the same tree, schedule and O2NC as zo_spider variant improved: gradients at points uniform in the ball of
    radius ``radius`` around the query point, one per row at a period's start, ``perturbations`` independent
    ones at each point of a difference; per-example vectors clipped in L2 (mechanism.clip,
    mechanism.difference_clip). Needs a backward pass per point: not forward-only."""

    kind: Literal["fo_spider"]
    radius: PositiveFloat = Field(..., description="alpha: the ball's radius (the guarantee is Goldstein "
                                  "stationarity at 2 alpha).")
    perturbations: Union[PositiveInt, Auto] = Field(
        "auto", description="Ball points per row at each point of a difference (single pass: m = log(8 d / "
        "delta_0) alpha^2 / (D^2 d), Lemma 6.4; multi-pass: L^2 Sigma / (b sigma_1^2) + L^2 / (b sigma_2^2), b "
        "the batch).")
    start_perturbations: Union[PositiveInt, Auto] = Field(
        "auto", description="Ball points per row at a restart (single pass: 1; multi-pass: as perturbations).")
    period: Union[PositiveInt, Auto, None] = Field(
        None, description="With sampling.kind full_batch or poisson (the multi-pass algorithm): steps between "
        "restarts, Sigma (auto: Theorem 4.1). A single pass takes sampling.period.")

    # what the planner shares with zo_spider's variant improved
    variant: ClassVar[str] = "improved_fo"

    @property
    def directions(self):
        return self.perturbations

    @property
    def start_directions(self):
        return self.start_perturbations


class ZoNaiveEstimator(Strict):
    """The baseline of Zhang et al. (the original nonsmooth algorithm's paper, Appendix E): with O2NC, one row
    a step, ``directions`` sphere directions per row, each coefficient clipped to mechanism.clip, released
    with d-dimensional Gaussian noise."""

    kind: Literal["zo_naive"]
    radius: PositiveFloat
    directions: PositiveInt = 1


class FullGradientEstimator(Strict):
    """The KL paper's first-order oracle (Menart et al.; kl_spider, proximal_point, adaptive_noisy_gd): the
    mean over every private row of per-example gradients clipped in L2 to mechanism.clip (L0), or of
    per-example gradient differences between two iterates clipped to the optimizer's schedule (kl_spider).
    Not forward-only."""

    kind: Literal["full_gradient"]


EstimatorSpec = Annotated[
    Union[TwoPointEstimator, DpgdZerothEstimator, PazoMEstimator, PazoPEstimator, PazoSEstimator,
          FirstOrderEstimator, GepEstimator, DopeSgdEstimator, PdaDpmdEstimator, ZoSpiderEstimator,
          FoSpiderEstimator, ZoNaiveEstimator, FullGradientEstimator],
    Field(discriminator="kind"),
]
