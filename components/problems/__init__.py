"""Synthetic problems with exact evaluation oracles (build study §6.1), for checking the private nonsmooth
algorithms against their theorems: simulated private rows, the per-example loss as a model, and the
population objective's exact value and smoothed gradient."""
from components.problems.w_linear import WLinear, load_w_linear, smoothed_gradient, window_certificate

__all__ = ["WLinear", "load_w_linear", "smoothed_gradient", "window_certificate"]
