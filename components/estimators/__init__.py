"""Gradient estimators. Each declares its noisy queries per step (``components.queries``) and turns released
values into updates; the directions they query along are the direction engine's (``components.directions``)."""
from components.estimators.first_order import FirstOrderEstimator
from components.estimators.full_gradient import FullGradientEstimator
from components.estimators.gep import GepEstimator, anchor_basis
from components.estimators.pazo import PazoMEstimator, PazoPEstimator, PazoSEstimator
from components.estimators.public_first_order import DopeSgdEstimator, PdaDpmdEstimator
from components.estimators.spider import FoSpiderEstimator, ZoNaiveEstimator, ZoSpiderEstimator
from components.estimators.two_point import DpgdZerothEstimator, TwoPointEstimator

__all__ = [
    "DopeSgdEstimator", "DpgdZerothEstimator", "FirstOrderEstimator", "FoSpiderEstimator", "FullGradientEstimator",
    "GepEstimator", "PazoMEstimator", "PazoPEstimator", "PazoSEstimator", "PdaDpmdEstimator", "TwoPointEstimator",
    "ZoNaiveEstimator", "ZoSpiderEstimator", "anchor_basis",
]
