"""privzo tune's candidates one after another against the same candidates as Ray tasks on 2 workers, measured
in one run: the wall time of each, and their ratio. The candidates are fixed here (the flow draws K and the
settings from the OS's randomness) so both sides train the same work.

    .venv/bin/python bench/tune_parallel.py [--candidates 6] [--epochs 5]
"""
from __future__ import annotations

import argparse
import copy
import os
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    import torch

    import specs
    from components import builders
    from flows.tune import candidates_on_ray
    from flows.tune_candidates import train_candidate

    with open(os.path.join(ROOT, "specs", "examples", "digits_tune.yaml")) as f:
        d = yaml.safe_load(f)
    d["optimizer"] = {**d["optimizer"], "epochs": args.epochs}
    d.pop("budget", None)
    search_spec = specs.spec_from_dict(d)
    data = builders.load_data(search_spec)
    search = builders.plan(search_spec, data)[0]
    grid = search.tune.settings()
    settings = [grid[i % len(grid)] for i in range(args.candidates)]

    # one after another in this process, on the local backend with torch's threads (both cores): the flow's
    # path with execution.backend local
    local_dict = search.model_dump(mode="json")
    local_dict["execution"] = {**local_dict["execution"], "backend": "local"}
    local = specs.RunSpec.model_validate(local_dict)
    start = time.perf_counter()
    one_by_one = [train_candidate(local, s, data).score for s in settings]
    sequential = time.perf_counter() - start

    ray_spec = copy.deepcopy(search.model_dump(mode="json"))
    ray_spec["execution"] = {**ray_spec["execution"], "backend": "ray", "workers": args.workers}
    on_ray = specs.RunSpec.model_validate(ray_spec)
    import ray

    from components.runtime.ray_backend import connect

    connect("local", args.workers)  # started before the clock: a team's cluster is already running
    start = time.perf_counter()
    best = candidates_on_ray(on_ray, settings, data)
    parallel = time.perf_counter() - start
    ray.shutdown()
    print(f"{len(settings)} candidates of {search.optimizer.steps} steps ({search.estimator.kind}, "
          f"{search.model.kind}) on digits; torch threads here {torch.get_num_threads()}, 1 in each Ray task")
    print(f"one after another: {sequential:.1f} s; as Ray tasks on {args.workers} workers: {parallel:.1f} s; "
          f"ratio {sequential / parallel:.2f}x")
    print(f"best score one after another {max(one_by_one):.4f}, on Ray {best.score:.4f} (fresh noise: they differ)")


if __name__ == "__main__":
    main()
