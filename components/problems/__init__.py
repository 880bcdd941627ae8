"""Synthetic problems with exact evaluation oracles (build study §6.1), for checking the private nonsmooth
algorithms (papers 001, 002) and the KL ones (paper 003) against their theorems: simulated private rows, the per-example loss as a model, and the
population objective's exact value and smoothed gradient."""
from components.problems.kl import KL_PROBLEMS, KlObjective, kl_constants, kl_rows
from components.problems.w_linear import WLinear, load_w_linear, smoothed_gradient, window_certificate

__all__ = ["KL_PROBLEMS", "KlObjective", "kl_constants", "kl_rows", "WLinear", "load_w_linear", "smoothed_gradient", "window_certificate"]
