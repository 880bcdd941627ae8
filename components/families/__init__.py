"""The three algorithm families, each a package that owns its plan (steps, sigma, the planned DpEvent) and
registers the builders of its own kinds; specs/rules/ holds each family's validation rules.

A run's family is chosen once, from its spec (``family_for``; specs/traits.py says which family a kind
belongs to). docs/design.md, "Algorithm families"."""
from __future__ import annotations

from typing import Dict, List, Optional, Protocol, Tuple

from components.families import kl, nonsmooth, standard
from specs.traits import KL, NONSMOOTH, STANDARD, family_of


class Family(Protocol):
    """What the builders and the flows ask of a family."""

    name: str
    needs_dimension: bool  # its plan reads the model's dimension (theory presets)

    def resolve(self, spec, n_private: Optional[int], dimension: Optional[int]) -> Tuple[object, float, float]:
        """(resolved spec, sampling rate, planned epsilon): sigma calibrated, every ``auto`` filled."""

    def planned_event(self, spec, n_private: Optional[int], sigma: float):
        """The DpEvent of the whole planned run at noise multiplier ``sigma`` (what is reserved)."""

    def describe_plan(self, resolved, n: int, dimension: Optional[int]) -> List[str]:
        """Lines for ``privzo calibrate``: what the family's preset derived, before the common lines."""


FAMILIES: Dict[str, Family] = {STANDARD: standard.FAMILY, NONSMOOTH: nonsmooth.FAMILY, KL: kl.FAMILY}


def family_for(spec) -> Family:
    """The spec's family; a search (``tune``) plans as the best of K candidates."""
    if getattr(spec, "tune", None) is not None and family_of(spec) == STANDARD:
        return standard.TUNED
    return FAMILIES[family_of(spec)]
