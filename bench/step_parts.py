"""Where a two_point step's time goes, part by part, on the bench MLP and on MiniLM.

For each model: a bare forward, drawing a cached direction, a perturbed forward with the direction
cached, a perturbed forward regenerating it, and an update from the cached direction; medians in ms.
With ``--profile`` it then prints torch.profiler's table for a few whole cache-mode steps on MiniLM.

    python bench/step_parts.py [--device cpu|cuda] [--models mlp transformer] [--repeats 30] [--profile]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.step_cost as sc  # noqa: E402
from components import models  # noqa: E402
from components.directions import Directions, add_direction_, perturbed  # noqa: E402


def parts(name: str, repeats: int) -> str:
    model = sc.build_model(name).eval()
    x, y = sc.data_for(name, sc.BATCHES[name])
    params = models.trainable_parameters(model)
    d = Directions(params, "gaussian")
    seeds = iter(range(10**9))

    def forward():
        with torch.inference_mode():
            models.per_example_loss(model, x, y)

    def draw():
        with d.cached([next(seeds)]):
            pass

    def perturbed_cached():
        with torch.inference_mode(), perturbed(model, d, 7, 1e-3):
            models.per_example_loss(model, x, y)

    def perturbed_regenerated():
        with torch.inference_mode(), perturbed(model, d, 7, 1e-3):
            models.per_example_loss(model, x, y)

    def update():
        add_direction_(d, 7, -1e-9)

    regenerated = sc.median_ms(perturbed_regenerated, repeats)
    with d.cached([7]):
        cached = sc.median_ms(perturbed_cached, repeats)
        upd = sc.median_ms(update, repeats)
    return (f"{name:12} {sum(p.numel() for p in params):>10} {len(params):>7} {sc.median_ms(forward, repeats):9.3f} "
            f"{sc.median_ms(draw, repeats):9.3f} {cached:11.3f} {regenerated:11.3f} {upd:9.3f}")


def profile(steps: int) -> None:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    from components.accountants import Accountant, PrivacyTracker
    from components.estimators import TwoPointEstimator
    from components.mechanisms import GaussianMechanism
    from components.optimizers import Sgd
    from components.randomness import private_generator
    from components.runtime import LocalBackend, PrivateLoop

    model = sc.build_model("transformer").eval()
    x, y = sc.data_for("transformer", sc.BATCHES["transformer"])
    d = Directions(models.trainable_parameters(model), "gaussian")
    mech = GaussianMechanism(1.0, 1.0, 1, "add_remove", private_generator())
    loop = PrivateLoop(LocalBackend(model, d, Sgd(d, lr=1e-6), x, y, cache_directions=True),
                       sc.FixedBatch(sc.BATCHES["transformer"]), TwoPointEstimator(1, 1e-3), mech,
                       PrivacyTracker(Accountant("rdp"), mech.step_event(), 1e-5), seed=0)
    loop.run(3)
    sc.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if sc.DEVICE.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        loop.run(3 + steps)
        sc.synchronize()
    print(f"# torch.profiler, {steps} two_point cache steps on MiniLM")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--models", nargs="+", default=["mlp", "transformer"], choices=["mlp", "transformer"])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    sc.DEVICE = torch.device(args.device)
    print(f"# two_point step parts, median ms of {args.repeats}, device {args.device}, torch {torch.__version__}")
    print(f"{'model':12} {'params':>10} {'tensors':>7} {'forward':>9} {'draw':>9} {'pert cache':>11} "
          f"{'pert regen':>11} {'update':>9}")
    for name in args.models:
        print(parts(name, args.repeats), flush=True)
    if args.profile:
        profile(5)


if __name__ == "__main__":
    main()
