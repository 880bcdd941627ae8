"""The audit table of docs/audit.md: claimed epsilon against the audited lower bound, per estimator and
epsilon, and the same audit on deliberately broken runs (noise off, sigma / 10) at one epsilon.

    .venv/bin/python bench/audit_table.py                       # the docs' table (about 15 minutes on 2 cores)
    .venv/bin/python bench/audit_table.py --steps 20 --canaries 20 --specs specs/examples/digits_dpzero.yaml
    .venv/bin/python bench/audit_table.py --specs specs/examples/q1_kl_spider.yaml --epsilons 4 1  # theory families
    .venv/bin/python bench/audit_table.py --specs specs/examples/p1_o2nc_002.yaml --epsilons 1 \
        --set estimator.coupling=independent --set estimator.start_directions=8 --set estimator.directions=8

Each row is one `privzo audit SPEC --epsilon E [--noise-scale S]`, run in-process without MLflow (the
same component the command runs), timed end to end (calibration included) on the torch threads given.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import specs  # noqa: E402
from components import builders  # noqa: E402
from components.audit import audit, audit_many, default_runs, with_epsilon  # noqa: E402

DEFAULT_SPECS = ["specs/examples/digits_dpzero.yaml", "specs/examples/digits_pazo_m.yaml",
                 "specs/examples/digits_pazo_s.yaml", "specs/examples/digits_dp_sgd.yaml"]
NAMES = {"two_point": "DPZero", "pazo_m": "PAZO-M", "pazo_s": "PAZO-S", "first_order": "DP-SGD"}
# the theory families, by optimizer (KL) or by oracle and mechanism (O2NC)
KL_NAMES = {"kl_spider": "KL-Spider", "proximal_point": "proximal point", "adaptive_noisy_gd": "adaptive noisy GD"}


def _name(spec) -> str:
    if spec.optimizer.kind in KL_NAMES:
        return KL_NAMES[spec.optimizer.kind]
    if spec.optimizer.kind == "o2nc":
        est = spec.estimator
        variant = getattr(est, "variant", None)
        oracle = " ".join(str(part) for part in (est.kind, variant, getattr(est, "coupling", None)
                                                 if variant == "improved" else None) if part)
        return f"O2NC ({oracle}, {spec.mechanism.kind.replace('_', ' ')})"
    return NAMES.get(spec.estimator.kind, spec.estimator.kind)


def _with_steps(spec, steps):
    data = spec.model_dump(mode="json")
    data["optimizer"]["steps"], data["optimizer"]["epochs"] = steps, None
    return specs.spec_from_dict(data)


def _with_settings(spec, settings):
    """``spec`` with each FIELD=VALUE of ``settings`` set (VALUE read as YAML), validated again."""
    if not settings:
        return spec
    data = spec.model_dump(mode="json", exclude_unset=True)
    for setting in settings:
        field, sep, value = setting.partition("=")
        if not sep or not field:
            raise SystemExit(f"--set: {setting!r} is not FIELD=VALUE (e.g. estimator.directions=8)")
        *parents, last = field.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = yaml.safe_load(value)
    return specs.spec_from_dict(data)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--specs", nargs="+", default=DEFAULT_SPECS)
    p.add_argument("--epsilons", nargs="+", type=float, default=[1.0, 4.0])
    p.add_argument("--broken-epsilon", type=float, default=1.0, help="epsilon of the broken runs")
    p.add_argument("--noise-scales", nargs="+", type=float, default=[0.0, 0.1], help="broken runs' noise factors")
    p.add_argument("--canaries", type=int, default=None, help="default: the audit's own choice per spec")
    p.add_argument("--runs", type=int, default=None,
                   help="training runs per audit (default: the audit's own choice per spec: 100 for PAZO-S, else 1)")
    p.add_argument("--steps", type=int, default=None, help="override the specs' steps (quick checks only)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="change a field of every spec (repeatable), e.g. estimator.directions=8")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    cells = [(path, eps, 1.0) for path in args.specs for eps in args.epsilons]
    cells += [(path, args.broken_epsilon, s) for path in args.specs for s in args.noise_scales]
    print("| estimator | claimed ε | δ | σ | steps | design | noise | white-box ε ≥ (correct/guesses) | "
          "black-box ε ≥ (correct/guesses) | refuted | ceiling | time (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    total = 0.0
    for path, eps, scale in cells:
        spec = with_epsilon(_with_settings(specs.load_spec(ROOT / path), args.set), eps)
        if args.steps is not None:
            spec = _with_steps(spec, args.steps)
        start = time.perf_counter()
        data = builders.load_data(spec)
        runs = args.runs or default_runs(spec)
        if runs == 1:
            r = audit(spec, data, canaries=args.canaries, confidence=args.confidence, noise_scale=scale)
        else:
            r = audit_many(spec, data, runs=runs, confidence=args.confidence, noise_scale=scale)
        design = f"{r.runs} runs × 1" if r.method == "many-runs" else f"1 run × {r.canaries}"
        seconds = time.perf_counter() - start
        total += seconds
        noise = "as claimed" if scale == 1.0 else ("off" if scale == 0.0 else f"σ × {scale:g}")
        w, b = r.white_box, r.black_box
        print(f"| {_name(spec)} | {r.claimed_epsilon:.3g} | {r.delta:.2g} | "
              f"{r.noise_multiplier:.3g} | {r.steps} | {design} | {noise} | "
              f"{w.epsilon_lower:.2f} ({w.correct}/{w.guesses}) | {b.epsilon_lower:.2f} ({b.correct}/{b.guesses}) | "
              f"{'**yes**' if r.exceeds_claim else 'no'} | {r.ceiling:.2f} | "
              f"{seconds:.0f} |", flush=True)
    print(f"\n{len(cells)} audits in {total:.0f} s on {args.threads} torch thread(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
