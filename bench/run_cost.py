"""What one sweep cell of a spec costs here, without running it whole: the public warm start, a few private
steps, and one test evaluation are timed, and the cell's time is extrapolated to its planned steps.

For deciding which cells of a sweep fit a machine (docs/results_pazo.md): a cell's time is about
load + warm start + steps x (time per step) + evaluation, and a sweep's the sum over its cells.

    PYTHONPATH=. python bench/run_cost.py SPEC [SPEC ...] [--steps 10] [--epsilon 2]
"""
from __future__ import annotations

import argparse
import sys
import time


def cost(path: str, steps: int, epsilon: float) -> dict:
    import torch

    import specs
    from components import builders, models

    data = specs.load_spec(path).model_dump(mode="json")
    data["privacy"]["epsilon"] = epsilon
    spec = specs.spec_from_dict(data)
    started = time.perf_counter()
    split = builders.load_data(spec)
    resolved, _rate, _eps = builders.plan(spec, split)
    built = builders.build_loop(resolved, split)
    loaded = time.perf_counter()
    builders.public_warm_start(resolved, built)
    warmed = time.perf_counter()
    timed = min(steps, resolved.optimizer.steps)
    built.loop.run(timed)
    stepped = time.perf_counter()
    models.evaluate(built.model, torch.as_tensor(split.test.features, device=built.device),
                    torch.as_tensor(split.test.labels, device=built.device))
    evaluated = time.perf_counter()
    per_step = (stepped - warmed) / timed
    return {"spec": resolved.name, "planned_steps": resolved.optimizer.steps, "load_s": loaded - started,
            "warm_start_s": warmed - loaded, "step_s": per_step, "evaluation_s": evaluated - stepped,
            "cell_s": (loaded - started) + (warmed - loaded) + per_step * resolved.optimizer.steps
            + (evaluated - stepped)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+")
    parser.add_argument("--steps", type=int, default=10, help="private steps timed per spec")
    parser.add_argument("--epsilon", type=float, default=2.0, help="the cell's epsilon (sets the noise, not the cost)")
    args = parser.parse_args(argv)
    print(f"{'spec':32} {'steps':>6} {'load s':>7} {'warm s':>7} {'s/step':>7} {'eval s':>7} {'cell s':>8}")
    total = 0.0
    for path in args.specs:
        c = cost(path, args.steps, args.epsilon)
        total += c["cell_s"]
        print(f"{c['spec']:32} {c['planned_steps']:6d} {c['load_s']:7.1f} {c['warm_start_s']:7.1f} {c['step_s']:7.3f} "
              f"{c['evaluation_s']:7.1f} {c['cell_s']:8.0f}", flush=True)
    print(f"# one cell of each: {total / 60:.1f} min; x 5 epsilons x 3 seeds: {total * 15 / 3600:.1f} h")


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    main()
