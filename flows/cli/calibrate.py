"""``privzo calibrate SPEC``: sigma, steps, sampling rate and epsilon as the run will plan them, and its memory
plan against the device's."""
from __future__ import annotations

import sys

import specs
from flows.cli.common import INSECURE, say_over_declared


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="print sigma, steps, sampling rate and epsilon for a spec")
    p.add_argument("spec")
    p.set_defaults(func=command)


def command(args) -> int:
    spec = specs.load_spec(args.spec)
    from components import builders
    from components.families import family_for

    data = builders.load_data(spec, every_block=True)
    n = len(data.private)
    resolved, rate, eps = builders.plan(spec, data)
    say_over_declared(spec)
    family = family_for(resolved)
    dimension = builders.model_dimension(resolved, data.n_features, data.n_classes) if family.needs_dimension else None
    for line in family.describe_plan(resolved, n, dimension):  # what the family's preset derived
        print(line)
    from components import memory_plan
    # peak memory against the device's, refused when over; the device's own line goes apart, on stderr: what
    # calibrate prints on stdout is the same for the same spec, whatever the machine has free at the moment
    memory_lines, machine_line = memory_plan.check_data(resolved, data)
    if resolved.privacy is None:
        print(f"mechanism none: no noise, not private ({resolved.optimizer.steps} steps)")
        print("\n".join(memory_lines))
        print(machine_line, file=sys.stderr)
        return 0
    sigma = float(resolved.mechanism.noise_multiplier)
    nominal = "" if resolved.private else "  NOT private: nominal only"
    if not resolved.private:
        print(f"privacy:                  {INSECURE}")
    print(f"noise_multiplier (sigma): {sigma:.6g}")
    print(f"steps:                    {resolved.optimizer.steps}")
    print(f"sampling rate:            {rate:.6g}  ({builders.spec_sampler(resolved, n).describe()})")
    print(f"epsilon:                  {eps:.6g}  (target {resolved.privacy.epsilon}, accountant "
          f"{resolved.privacy.accountant}){nominal}")
    large = (f"  above 1/N = 1/{resolved.public_rows(n)} (privacy.allow_large_delta): NOT a meaningful guarantee"
             if resolved.large_delta(n) else "")
    print(f"delta:                    {float(resolved.privacy.delta):.6g}{nominal}{large}")
    if resolved.privacy.accountant == "zcdp":
        rho = builders.accountant(resolved).rho(builders.planned_event(resolved, n, sigma))
        print(f"zCDP rho:                 {rho:.6g}{nominal}")
    print("\n".join(memory_lines))
    print(machine_line, file=sys.stderr)
    return 0
