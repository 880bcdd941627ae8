"""The standard family's rules: the private loop's mini-batch estimators (DPZero, PAZO-M/P/S, DP-SGD and the
first-order baselines) with sgd or adam."""
from __future__ import annotations

from typing import List

from specs.traits import SEEDED_DIRECTION_ESTIMATORS


def standard_problems(spec) -> List[str]:
    problems: List[str] = []
    est = spec.estimator
    if spec.execution.prefetch_directions:
        if est.kind not in SEEDED_DIRECTION_ESTIMATORS:
            seeded = list(SEEDED_DIRECTION_ESTIMATORS)
            problems.append(f"execution.prefetch_directions: {est.kind} has no seeded directions to draw ahead; "
                            f"remove it ({', '.join(seeded[:-1])} and {seeded[-1]} use it)")
        elif est.perturbation == "regenerate":
            problems.append("execution.prefetch_directions: needs cached directions; set estimator.perturbation "
                            "to cache or auto, or remove prefetch_directions")
    opt = spec.optimizer
    if est.kind == "pazo_s" and (opt.kind != "sgd" or opt.momentum or opt.weight_decay):
        field = "optimizer.kind" if opt.kind != "sgd" else "optimizer.momentum" if opt.momentum else \
            "optimizer.weight_decay"
        problems.append(f"{field}: pazo_s steps to the candidate it scored, x - lr * g, which only sgd without "
                        "momentum or weight decay reaches; use optimizer: {kind: sgd} with neither")
    return problems
