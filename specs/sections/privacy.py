"""The ``privacy`` section: the (epsilon, delta) target, its accountant and neighbouring relation, and where
DP noise comes from."""
from __future__ import annotations

from typing import Literal, Union

from pydantic import Field, PositiveFloat, model_validator

from specs.base import Auto, Probability, Strict


class PrivacySpec(Strict):
    epsilon: PositiveFloat = Field(..., description="Target DP epsilon of the whole run.")
    delta: Union[Probability, Auto] = Field(
        "auto", description="'auto' = 1/N, N the private rows (data.declared_private_rows where given). 1/N is the "
        "largest accepted: a mechanism that publishes one random row whole meets a delta above it, so it promises "
        "nothing of any one row (see allow_large_delta). Smaller is stronger, e.g. 1e-6.")
    accountant: Literal["rdp", "pld", "zcdp"] = Field(
        "rdp",
        description="rdp or pld for any sampling; zcdp (reports rho-zCDP as well) for sampling.kind full_batch "
        "only, as zCDP has no tight bound for subsampled steps.",
    )
    neighboring: Literal["add_remove", "replace_one"] = "add_remove"
    insecure_deterministic: bool = Field(
        False,
        description="Draw DP noise and batch selection from a generator seeded by `seed`. Makes runs "
        "repeatable and NOT private; the run is labelled not private everywhere it is recorded.",
    )
    allow_large_delta: bool = Field(
        False,
        description="Run with a delta above 1/N anyway (refused otherwise). Such a guarantee is met by publishing "
        "one random row whole; the run is labelled so wherever its guarantee is recorded.",
    )
    noise: Literal["auto", "secure", "fast"] = Field(
        "auto",
        description="Where DP noise and batch membership come from. secure: OpenDP's exact discrete Gaussian "
        "and exact Bernoulli draws from a CSPRNG, safe from floating-point attacks (Mironov 2012); fast: "
        "torch's generator seeded from OS entropy. auto: secure where it costs at most 2% of a step "
        "(bench/secure_noise.py): for the estimators that release q scalars per step (two_point, pazo_m, "
        "pazo_p, pazo_s) once expected batch rows x model parameters reach 8,000,000; fast otherwise, and "
        "always for d-dimensional releases (dpgd_0th, first_order, gep: tens of microseconds a coordinate).",
    )

    @model_validator(mode="after")
    def _secure_noise_is_not_seeded(self):
        if self.noise == "secure" and self.insecure_deterministic:
            raise ValueError("noise: secure contradicts insecure_deterministic: true (noise drawn from the seed); "
                             "set noise: auto or fast, or insecure_deterministic: false")
        return self
