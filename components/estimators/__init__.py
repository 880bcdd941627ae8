"""Gradient estimators. Each declares its private queries per step and how released values combine."""
from components.estimators.directions import Directions, add_direction_, perturbed
from components.estimators.two_point import StepPlan, TwoPointEstimator, ZoUpdate

__all__ = ["Directions", "StepPlan", "TwoPointEstimator", "ZoUpdate", "add_direction_", "perturbed"]
