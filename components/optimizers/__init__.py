"""Optimizers applying estimator updates to parameters in place."""
from components.optimizers.adam import Adam
from components.optimizers.o2nc import O2nc
from components.optimizers.sgd import Sgd, replay

__all__ = ["Adam", "O2nc", "Sgd", "replay"]
