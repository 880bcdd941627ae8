"""Shared base of every spec model: closed (unknown keys are errors) and immutable; and the value types
several sections share (``Auto``, ``Probability``)."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

Auto = Literal["auto"]
Probability = Annotated[float, Field(gt=0.0, lt=1.0)]  # a rate or a probability: 0 and 1 excluded


class Strict(BaseModel):
    """A spec section: unknown keys are rejected, values are frozen once validated."""

    # allow_inf_nan=False: an infinite epsilon, clip or rate is never meant, and NaN compares false to every
    # bound; strict: no coercion (YAML true is not 1.0, "2.0" is not a number, "yes" is not a boolean)
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False, strict=True)

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        # a NUL ends a path early in every system call (Python refuses it there) and names no column or
        # class: a path, URI or name holding one would validate and fail only once the run has started
        texts = value if isinstance(value, list) else [value]
        if any(isinstance(text, str) and "\x00" in text for text in texts):
            raise ValueError("holds a NUL character (\\x00); allowed: text without NUL")
        return value


def is_auto(value: Union[float, int, str, None]) -> bool:
    return value == "auto"
