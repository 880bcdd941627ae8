"""The nonsmooth family's rules: O2NC with zeroth- or first-order oracles (Zhang et al., "Private Zeroth-Order
Nonsmooth Nonconvex Optimization"; Kornowski et al., "Improved Sample Complexity for Private Nonsmooth
Nonconvex Optimization"), released by tree aggregation (one pass) or scheduled Gaussians (multi-pass)."""
from __future__ import annotations

from typing import List

from specs.traits import MULTI_PASS_SAMPLERS, NONSMOOTH_ESTIMATORS, RUNNING_SUM_ESTIMATORS


def nonsmooth_problems(spec) -> List[str]:
    """The rules of the private nonsmooth algorithms (O2NC with zeroth-order oracles, the two nonsmooth papers (Zhang et al.; Kornowski et al.))."""
    problems: List[str] = []
    est, mech, sampling, opt = spec.estimator, spec.mechanism, spec.sampling, spec.optimizer
    source, model = spec.data.source, spec.model
    if (source.kind == "synthetic") != (model.kind == "objective"):
        problems.append("model.kind: objective is the parameter vector of a synthetic problem; use it exactly with "
                        "data.source.kind: synthetic")
    if mech.kind == "tree_aggregation":
        if sampling.kind != "single_pass":
            # Poisson or fixed-size batches can put one row in two leaves of a tree, multiplying its node
            # sensitivity; dp-accounting has no event for amplified tree aggregation
            problems.append(f"sampling.kind: {sampling.kind} can put a row in several leaves of one tree, which "
                            "tree_aggregation does not account for; use sampling.kind: single_pass")
        if est.kind not in RUNNING_SUM_ESTIMATORS:
            problems.append(f"mechanism.kind: tree_aggregation releases running sums of zo_spider's or fo_spider's "
                            f"increments; "
                            f"estimator.kind {est.kind} is released by gaussian")
        if spec.privacy is not None and spec.privacy.noise == "secure":
            problems.append("privacy.noise: secure is not available with tree_aggregation yet; use fast or auto")
    multi_pass = est.kind in RUNNING_SUM_ESTIMATORS and sampling.kind in MULTI_PASS_SAMPLERS
    if est.kind in RUNNING_SUM_ESTIMATORS and not multi_pass and mech.kind not in ("tree_aggregation", "none"):
        problems.append(f"mechanism.kind: {est.kind}'s increments are released by tree_aggregation (or none, a "
                        f"non-private twin), not {mech.kind}")
    if multi_pass and mech.kind not in ("scheduled_gaussian", "none"):
        problems.append(f"mechanism.kind: {est.kind} over {sampling.kind} batches (the improved algorithm's multi-pass schedule) "
                        f"releases by scheduled_gaussian (or none, a non-private twin), not {mech.kind}")
    if mech.kind == "scheduled_gaussian" and not multi_pass:
        problems.append("mechanism.kind: scheduled_gaussian is the improved algorithm's multi-pass release; it needs estimator "
                        "zo_spider (variant improved) or fo_spider with sampling.kind: full_batch (or poisson, its "
                        "footnote 2)")
    if mech.kind == "scheduled_gaussian" and (mech.noise_multiplier == "auto") != (
            mech.difference_noise_multiplier == "auto"):
        problems.append("mechanism.difference_noise_multiplier: give both multipliers, or neither (auto: the paper's "
                        "ratio, one scale calibrated)")
    if multi_pass and getattr(est, "variant", None) == "original":
        problems.append(f"estimator.variant: the multi-pass algorithm (sampling.kind {sampling.kind}) is the improved algorithm's; "
                        "use variant: improved")
    if getattr(est, "period", None) is not None and not multi_pass:
        problems.append("estimator.period: only for the multi-pass algorithm (sampling.kind: full_batch or poisson); a single "
                        "pass takes sampling.period")
    if multi_pass and opt.kind == "o2nc" and opt.preset != "manual" and opt.target_stationarity is None:
        problems.append("optimizer.target_stationarity: the improved algorithm's multi-pass preset is planned for a target "
                        "beta (Theorem 4.1); give one, e.g. 0.5")
    if est.kind == "zo_naive" and mech.kind not in ("gaussian", "none"):
        problems.append(f"mechanism.kind: zo_naive releases one Gaussian vector a step; use gaussian, not {mech.kind}")
    if (est.kind in NONSMOOTH_ESTIMATORS) != (opt.kind == "o2nc"):
        problems.append("optimizer.kind: o2nc and the estimators zo_spider, fo_spider and zo_naive go together (the oracles "
                        "read O2NC's query points; O2NC needs their unbiased smoothed gradients)")
    if sampling.kind == "single_pass":
        if est.kind not in NONSMOOTH_ESTIMATORS:
            problems.append(f"sampling.kind: single_pass is for zo_spider, fo_spider and zo_naive, not {est.kind}")
        if spec.privacy is not None and spec.privacy.neighboring != "replace_one":
            problems.append("privacy.neighboring: single_pass batches are a fixed partition of the rows, which an "
                            "added row would shift; set neighboring: replace_one")
        if est.kind == "zo_naive" and sampling.period not in ("auto", 1):
            problems.append("sampling.period: zo_naive has no tree; set period: 1 (or auto)")
    elif est.kind in NONSMOOTH_ESTIMATORS and not multi_pass:
        problems.append(f"sampling.kind: {est.kind} reads each row once; use sampling.kind: single_pass"
                        + (" (or full_batch or poisson: the improved algorithm's multi-pass schedule)" if est.kind in RUNNING_SUM_ESTIMATORS
                           else ""))
    if opt.kind == "o2nc":
        autos = [name for name, value in (("optimizer.step_bound", opt.step_bound), ("optimizer.lr", opt.lr),
                                          ("optimizer.window", opt.window), ("optimizer.steps", opt.steps),
                                          ("optimizer.restart", opt.restart),
                                          ("sampling.start_batch", getattr(sampling, "start_batch", None)),
                                          ("sampling.period", getattr(sampling, "period", None)),
                                          ("estimator.start_directions", getattr(est, "start_directions", None)),
                                          ("estimator.directions", getattr(est, "directions", None)),
                                          ("estimator.period", getattr(est, "period", None)),
                                          ("mechanism.clip", getattr(mech, "clip", None)),
                                          ("mechanism.difference_clip", getattr(mech, "difference_clip", None)))
                 if value == "auto"]
        if opt.preset == "manual" and autos:
            problems.append(f"optimizer.preset: manual takes every setting as given; {autos[0]} is auto (give it, "
                            "or use preset: theory)")
        if opt.preset == "manual" and opt.target_stationarity is not None:
            problems.append("optimizer.target_stationarity: checked against the theorem by preset: theory only")
        improved = est.kind in RUNNING_SUM_ESTIMATORS and getattr(est, "variant", None) != "original"
        allowed = (("c_T", "c_D", "c_h", "c_s") if multi_pass else ("c_D", "c_Sigma", "c_h", "c_s")) if improved else ()
        stray = [c for c in opt.constants if c not in allowed]
        if stray:
            problems.append(f"optimizer.constants: {stray[0]} is not a constant of "
                            + (f"this algorithm's preset; allowed: {', '.join(allowed)}" if allowed else
                               "the original algorithm's presets, which hide none (theory_shape equals theory there)"))
        if opt.preset != "manual" and source.kind != "synthetic":
            a = spec.assumptions
            if a is None or a.lipschitz == "auto" or a.initial_gap == "auto":
                problems.append("assumptions: preset theory needs lipschitz and initial_gap (a synthetic source knows "
                                "its own); give them, or use preset: manual")
    if mech.kind == "gaussian" and mech.clip == "auto" and not (est.kind == "zo_naive" and opt.kind == "o2nc"
                                                                  and opt.preset != "manual"):
        problems.append("mechanism.clip: auto is derived by optimizer.preset theory (zo_naive); give a number")
    if spec.assumptions is not None and spec.assumptions.concentration_delta is not None and not (
            est.kind in RUNNING_SUM_ESTIMATORS and est.variant != "original"):
        problems.append("assumptions.concentration_delta: only the improved algorithm's clip levels use it")
    return problems
