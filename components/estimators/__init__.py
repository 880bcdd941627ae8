"""Gradient estimators. Each declares its noisy queries per step and turns released values into updates."""
from components.estimators.directions import Directions
from components.estimators.perturbation import add_direction_, perturbed
from components.estimators.first_order import FirstOrderEstimator
from components.estimators.full_gradient import FullGradientEstimator
from components.estimators.gep import GepEstimator, anchor_basis
from components.estimators.pazo import PazoMEstimator, PazoPEstimator, PazoSEstimator
from components.estimators.public_first_order import DopeSgdEstimator, PdaDpmdEstimator
from components.estimators.queries import (
    Dense,
    EmbeddedGradients,
    FiniteDifferences,
    LossValues,
    PerExampleGradients,
    Seeded,
    Update,
    VectorFiniteDifferences,
)
from components.estimators.spider import FoSpiderEstimator, ZoNaiveEstimator, ZoSpiderEstimator
from components.estimators.two_point import DpgdZerothEstimator, TwoPointEstimator

__all__ = [
    "Dense", "Directions", "DopeSgdEstimator", "DpgdZerothEstimator", "EmbeddedGradients", "FiniteDifferences",
    "FirstOrderEstimator", "FoSpiderEstimator", "FullGradientEstimator", "GepEstimator", "LossValues", "anchor_basis",
    "PazoMEstimator", "PazoPEstimator", "PazoSEstimator", "PdaDpmdEstimator", "PerExampleGradients", "Seeded",
    "TwoPointEstimator", "Update", "VectorFiniteDifferences", "ZoNaiveEstimator", "ZoSpiderEstimator",
    "add_direction_", "perturbed",
]
