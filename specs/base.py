"""Shared base of every spec model: closed (unknown keys are errors) and immutable."""
from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict

Auto = Literal["auto"]


class Strict(BaseModel):
    """A spec section: unknown keys are rejected, values are frozen once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def is_auto(value: Union[float, int, str, None]) -> bool:
    return value == "auto"
