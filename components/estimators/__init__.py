"""Gradient estimators. Each declares its noisy queries per step and turns released values into updates."""
from components.estimators.directions import Directions, add_direction_, perturbed
from components.estimators.pazo import PazoMEstimator, PazoPEstimator, PazoSEstimator
from components.estimators.queries import Dense, FiniteDifferences, LossValues, Seeded, Update, VectorFiniteDifferences
from components.estimators.two_point import DpgdZerothEstimator, TwoPointEstimator

__all__ = [
    "Dense", "Directions", "DpgdZerothEstimator", "FiniteDifferences", "LossValues", "PazoMEstimator",
    "PazoPEstimator", "PazoSEstimator", "Seeded", "TwoPointEstimator", "Update", "VectorFiniteDifferences",
    "add_direction_", "perturbed",
]
