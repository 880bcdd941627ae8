"""The ``assumptions`` section: what a theory preset assumes of the loss (never what privacy rests on)."""
from __future__ import annotations

from typing import Optional, Union

from pydantic import Field, PositiveFloat

from specs.base import Auto, Probability, Strict


class KlSpec(Strict):
    """(gamma, kappa)-KL*: F(w) - F* <= gamma^kappa |grad F(w)|^kappa on the ball (kappa = 2: PL)."""

    gamma: PositiveFloat
    kappa: float = Field(..., ge=1.0, le=8.0)


class AssumptionsSpec(Strict):
    """What a theorem assumes of the loss, read only by presets (never by privacy: every per-example value
    is clipped at these bounds, so privacy holds whatever the loss). A synthetic source fills them."""

    lipschitz: Union[PositiveFloat, Auto] = Field("auto", description="L: every per-example loss is L-Lipschitz.")
    initial_gap: Union[PositiveFloat, Auto] = Field("auto", description="Phi >= F(x_0) - inf F.")
    concentration_delta: Optional[Probability] = Field(
        None, description="delta_0 of the improved nonsmooth algorithm's clip levels (Kornowski et al.; default: "
        "privacy.delta / 2); privacy rests on the clips, not on it.")
    smoothness: Union[PositiveFloat, Auto] = Field("auto", description="L1: grad f is L1-Lipschitz (the KL paper).")
    weak_convexity: Union[PositiveFloat, Auto] = Field("auto", description="L~1: f + L~1 |w|^2 / 2 is convex "
                                                       "(the KL paper's proximal point).")
    kl: Optional[KlSpec] = Field(None, description="(gamma, kappa) of the KL* condition (the KL paper, "
                                    "Menart et al.).")
    radius: Union[PositiveFloat, Auto] = Field("auto", description="B: the ball around the start on which the "
                                               "assumptions hold (a synthetic source's default: 1).")
    failure_probability: Probability = Field(0.1, description="beta of the KL paper's theorems (sets thresholds "
                                             "and logs; privacy does not depend on it).")
