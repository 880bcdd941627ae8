"""Optimizers applying estimator updates to parameters in place."""
from components.optimizers.sgd import Sgd, replay

__all__ = ["Sgd", "replay"]
