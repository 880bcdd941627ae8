"""The direction engine: public random directions drawn from integer seeds (``Directions``), forward passes
at perturbed points and the update x <- x + scale * u (``perturbed``, ``add_direction_``), their values drawn
by one of two generators behind one interface (``streams``): on a CPU in chunked torch streams (``chunks``), on a
CUDA device in counter-based Philox kernels (``philox``).

It stands below the estimators, the queries and the runtime, which use it; it imports none of them."""
from components.directions import philox
from components.directions.chunks import CHUNK, GENERATOR_VERSION
from components.directions.engine import Directions
from components.directions.perturbation import add_direction_, direction_tensor, perturbation_capacity, perturbed
from components.directions.streams import row_lookup

__all__ = ["CHUNK", "GENERATOR_VERSION", "Directions", "add_direction_", "direction_tensor", "perturbation_capacity",
           "perturbed", "philox", "row_lookup"]
