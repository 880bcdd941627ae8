"""Shared base of every spec model: closed (unknown keys are errors) and immutable."""
from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict

Auto = Literal["auto"]


class Strict(BaseModel):
    """A spec section: unknown keys are rejected, values are frozen once validated."""

    # allow_inf_nan=False: an infinite epsilon, clip or rate is never meant, and NaN compares false to every
    # bound; strict: no coercion (YAML true is not 1.0, "2.0" is not a number, "yes" is not a boolean)
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False, strict=True)


def is_auto(value: Union[float, int, str, None]) -> bool:
    return value == "auto"
