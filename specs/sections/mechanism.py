"""The ``mechanism`` section: how a step's estimate is clipped and noised before it is released."""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, PositiveFloat

from specs.base import Auto, Strict


class GaussianMechanism(Strict):
    """Per-example clipping to C, then Gaussian noise of std sigma * sensitivity * sqrt(queries)."""

    kind: Literal["gaussian"]
    clip: Union[PositiveFloat, Auto] = Field(..., description="C; auto only with optimizer.preset theory "
                                             "(zo_naive: L sqrt(d)).")
    noise_multiplier: Union[PositiveFloat, Auto] = "auto"


class TreeAggregationMechanism(Strict):
    """Tree aggregation (the original and improved nonsmooth algorithms: Zhang et al., Kornowski et al.): each
    step's increment (a batch mean of per-example clipped estimates) joins a running sum over the period,
    released with the noise of the Fenwick nodes that cover it, a fresh tree each period. One row changes
    exactly the nodes over its step, each by at most the node sensitivity Delta = 2 x (per-example bound) /
    batch; the run is accounted exactly as floor(log2 period) + 1 Gaussian releases of multiplier
    noise_multiplier = node std / Delta."""

    kind: Literal["tree_aggregation"]
    clip: Union[PositiveFloat, Auto] = Field("auto", description="Per-example bound at a period's start "
                                             "(original: on every coefficient, L sqrt(d); improved and "
                                             "fo_spider: on the vector, C_G).")
    difference_clip: Union[PositiveFloat, Auto] = Field(
        "auto", description="original: coefficient clip of a difference at a move of r (scaled by |z_t - "
        "z_(t-1)| / r), L sqrt(d); improved and fo_spider: the vector clip C_Delta of a difference.")
    noise_multiplier: Union[PositiveFloat, Auto] = "auto"

class ScheduledGaussianMechanism(Strict):
    """The improved nonsmooth algorithm's multi-pass full-batch form (Kornowski et al., Algorithm 4): every
    step releases its increment (the mean over all rows of per-example clipped estimates) with fresh Gaussian
    noise, added to the previous released sum, restarted every estimator.period steps. Restarts and
    differences are two Gaussian classes (multiplier = std / Delta, Delta = 2 clip / n), their stds in the
    paper's ratio; the run is accounted exactly as their composition. With sampling.kind poisson (the paper's
    footnote 2, add/remove) each step reads a Poisson batch normalised by its expected size b, Delta = clip /
    b, and each release is accounted as a Poisson-subsampled Gaussian."""

    kind: Literal["scheduled_gaussian"]
    clip: Union[PositiveFloat, Auto] = Field("auto", description="Per-example L2 bound at a restart, C_G.")
    difference_clip: Union[PositiveFloat, Auto] = Field("auto", description="Per-example L2 bound of a "
                                                        "difference, C_Delta.")
    noise_multiplier: Union[PositiveFloat, Auto] = Field("auto", description="A restart's std / Delta (auto: "
                                                         "calibrated on the run's event).")
    difference_noise_multiplier: Union[PositiveFloat, Auto] = Field(
        "auto", description="A difference's std / Delta (auto: the paper's ratio of stds to the restart's).")


class PlannedGaussianMechanism(Strict):
    """The KL paper's fixed-plan releases (Menart et al.; kl_spider, proximal_point): every release a Gaussian
    of the std the preset's schedule gives it, all stds scaled by one factor so that the planned releases
    compose to exactly one Gaussian of multiplier noise_multiplier (rho = 1 / (2 noise_multiplier^2) in zCDP).
    The run is charged that plan whether or not it stops early, and can never release past it."""

    kind: Literal["planned_gaussian"]
    clip: Union[PositiveFloat, Auto] = Field("auto", description="C0, the per-example gradient clip (auto: "
                                             "assumptions.lipschitz, L0). A difference's clip comes from the plan.")
    noise_multiplier: Union[PositiveFloat, Auto] = Field(
        "auto", description="The multiplier of the one Gaussian the whole plan equals (auto: calibrated on the "
        "privacy target).")


class AdaptiveGaussianMechanism(Strict):
    """The KL paper's adaptive noisy GD (Menart et al., Algorithm 3): each step releases a noisy norm of the
    clipped mean gradient, then the gradient with noise set from that released norm; a privacy filter adds
    each release's exact cost and stops the run before the budget can be passed. The run is charged the
    filter's budget (plus the exponential-mechanism selection with optimizer.select exponential)."""

    kind: Literal["adaptive_gaussian"]
    clip: Union[PositiveFloat, Auto] = Field("auto", description="C0 (auto: assumptions.lipschitz, L0).")
    filter: Literal["gdp", "zcdp"] = Field(
        "gdp", description="gdp: the filter of Smith and Thakurta (charged as one Gaussian); zcdp: Whitehouse et "
        "al.'s (charged as a zCDP event; accountant rdp or zcdp).")
    noise_multiplier: Union[PositiveFloat, Auto] = Field(
        "auto", description="The multiplier of the one Gaussian the whole budget equals (auto: calibrated).")


class NoMechanism(Strict):
    """No clipping and no noise: a non-private run (MeZO with two_point). Labelled not private everywhere."""

    kind: Literal["none"]


MechanismSpec = Annotated[Union[GaussianMechanism, NoMechanism, TreeAggregationMechanism, ScheduledGaussianMechanism,
                                PlannedGaussianMechanism, AdaptiveGaussianMechanism],
                          Field(discriminator="kind")]
