"""model.kind objective: the parameter vector of a synthetic problem, whose per-example loss is the problem's
(the family that owns the problem, in specs/traits.py PROBLEMS, builds it)."""
from __future__ import annotations

from typing import Optional

import torch

from components.registry import MODELS
from specs.traits import KL, PROBLEMS


@MODELS.register("objective")
def _objective(spec, n_features: int, n_classes: int, generator: Optional[torch.Generator] = None):
    source = spec.data.source
    if generator is None:  # shapes only
        from components.families.nonsmooth.problems import WLinear

        with torch.device("meta"):
            return WLinear(torch.empty(source.dimension, dtype=torch.float64))
    start = torch.full((source.dimension,), float(source.start), dtype=torch.float64)
    if PROBLEMS[source.problem] == KL:
        from components.families.kl.plan import synthetic_rows
        from components.families.kl.problems import KlObjective

        # its exact evaluation reads the simulated rows, a public function of the spec (every row is private)
        return KlObjective(source.problem, start, synthetic_rows(spec))
    from components.families.nonsmooth.problems import WLinear

    return WLinear(start)
