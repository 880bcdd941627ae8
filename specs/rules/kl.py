"""The KL family's rules: full-batch first order under the KL condition (Menart et al., "Differentially
Private Non-Convex Optimization under the KL Condition with Optimal Rates"), zCDP-style accounting."""
from __future__ import annotations

from typing import List

from specs.traits import KL_OPTIMIZERS, KL_PROBLEMS

# what each optimizer's preset reads of the assumptions (a synthetic KL problem knows its own)
KL_ASSUMPTIONS = {"kl_spider": ("lipschitz", "smoothness", "initial_gap", "kl"),
                  "proximal_point": ("lipschitz", "weak_convexity", "initial_gap", "kl"),
                  "adaptive_noisy_gd": ("lipschitz", "smoothness")}


def kl_problems(spec) -> List[str]:
    """The rules of the KL paper's algorithms (Menart et al.) (full-batch first order under replace-one, zCDP-style accounting)."""
    problems: List[str] = []
    est, mech, sampling, opt = spec.estimator, spec.mechanism, spec.sampling, spec.optimizer
    source = spec.data.source
    kl_opt = opt.kind in KL_OPTIMIZERS
    if (est.kind == "full_gradient") != kl_opt:
        problems.append("estimator.kind: full_gradient and the optimizers kl_spider, proximal_point and "
                        "adaptive_noisy_gd go together (they plan its releases)")
    if not kl_opt:
        if mech.kind in ("planned_gaussian", "adaptive_gaussian"):
            problems.append(f"mechanism.kind: {mech.kind} releases the KL paper's optimizers (kl_spider, "
                            "proximal_point, adaptive_noisy_gd); use gaussian")
        if source.kind == "synthetic" and source.problem in KL_PROBLEMS and opt.kind == "o2nc":
            problems.append(f"data.source.problem: {source.problem} is the KL paper's; o2nc's presets know w_linear only")
        return problems
    if sampling.kind != "full_batch":
        problems.append(f"sampling.kind: {opt.kind} reads every private row every step; use full_batch")
    wanted = "adaptive_gaussian" if opt.kind == "adaptive_noisy_gd" else "planned_gaussian"
    if mech.kind != wanted:
        problems.append(f"mechanism.kind: {opt.kind} releases by {wanted} (its schedule is planned from the privacy "
                        f"budget), not {mech.kind}")
    if source.kind == "synthetic" and source.problem not in KL_PROBLEMS:
        problems.append(f"data.source.problem: {opt.kind} needs a smooth or weakly convex problem; use one of "
                        f"{', '.join(KL_PROBLEMS)}")
    if spec.privacy is not None and spec.privacy.noise == "secure":
        problems.append(f"privacy.noise: secure is not available with {opt.kind} yet; use fast or auto")
    accountant = spec.privacy.accountant if spec.privacy is not None else None
    if accountant == "pld" and mech.kind == "adaptive_gaussian" and (
            mech.filter == "zcdp" or getattr(opt, "select", "last") == "exponential"):
        why = "the zcdp filter" if mech.filter == "zcdp" else "the exponential-mechanism selection"
        problems.append(f"privacy.accountant: pld has no form for {why} (a zCDP event); use rdp or zcdp")
    if source.kind != "synthetic" or source.problem not in KL_PROBLEMS:
        given = spec.assumptions
        missing = [name for name in KL_ASSUMPTIONS[opt.kind]
                   if given is None or getattr(given, name) in ("auto", None)]
        if missing:
            problems.append(f"assumptions.{missing[0]}: {opt.kind}'s preset needs "
                            f"{', '.join(KL_ASSUMPTIONS[opt.kind])} (a synthetic KL problem knows its own)")
    kl = spec.assumptions.kl if spec.assumptions is not None else None
    if kl is not None and opt.kind == "kl_spider" and not 1.0 <= kl.kappa <= 2.0:
        problems.append(f"assumptions.kl.kappa: kl_spider is for kappa in [1, 2], not {kl.kappa:g}; use "
                        "proximal_point for kappa >= 2")
    if kl is not None and opt.kind == "proximal_point" and kl.kappa < 2.0:
        problems.append(f"assumptions.kl.kappa: proximal_point is for kappa >= 2, not {kl.kappa:g}; use kl_spider")
    if source.kind == "synthetic" and source.problem in KL_PROBLEMS:
        split = spec.data.split
        if split.kind != "fraction" or split.public != 0 or split.test != 0:
            problems.append("data.split: a KL problem's risk is over every simulated row (its closed-form "
                            "minimiser); use {kind: fraction, public: 0, test: 0}")
    return problems
