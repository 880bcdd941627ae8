"""Peak memory of a zeroth-order step against inference, on the transformer (MiniLM + linear head).

Each measurement runs in a fresh process and reads its peak memory (on CPU the resident set, ru_maxrss;
on a GPU the peak of torch's device allocations, which is what a GPU runs out of): (a) inference only,
forward passes at batch 32; (b) two_point steps in regenerate mode; (c) in cache mode. Extra memory is
printed in units of the model's largest parameter tensor: regenerate mode should need about one,
cache mode about d more (the cached direction).

    python bench/memory.py [--model transformer|mlp] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys


def measure(mode: str, model_name: str, device: str) -> dict:
    import torch

    import bench.step_cost as sc
    sc.DEVICE = torch.device(device)
    from components import models
    from components.accountants import Accountant, PrivacyTracker
    from components.estimators import Directions, TwoPointEstimator
    from components.mechanisms import GaussianMechanism
    from components.optimizers import Sgd
    from components.randomness import private_generator
    from components.runtime import LocalBackend, PrivateLoop

    batch = sc.BATCHES[model_name]
    model = sc.build_model(model_name).eval()
    x, y = sc.data_for(model_name, batch)
    params = models.trainable_parameters(model)
    largest = max(p.numel() * p.element_size() for p in params)
    total = sum(p.numel() * p.element_size() for p in params)
    if mode == "inference":
        for _ in range(4):
            with torch.inference_mode():
                models.per_example_loss(model, x, y)
    else:
        d = Directions(params, "gaussian")
        backend = LocalBackend(model, d, Sgd(d, lr=1e-6), x, y, cache_directions=(mode == "cache"))
        mech = GaussianMechanism(1.0, 1.0, 1, "add_remove", private_generator())
        loop = PrivateLoop(backend, sc.FixedBatch(batch), TwoPointEstimator(1, 1e-3), mech,
                           PrivacyTracker(Accountant("rdp"), mech.step_event(), 1e-5), seed=0)
        loop.run(4)
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {"peak": peak, "largest": largest, "params": total}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="transformer", choices=["transformer", "mlp"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.model, args.device)))
        return
    results = {}
    for mode in ("inference", "regenerate", "cache"):
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--device", args.device, "--child", mode],
                             capture_output=True, text=True, check=True)
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    base = results["inference"]
    mib = 2 ** 20
    what = "peak GPU allocation" if args.device == "cuda" else "peak RSS"
    print(f"# {what}, {args.model}: parameters {base['params'] / mib:.1f} MiB, largest tensor {base['largest'] / mib:.1f} MiB")
    print(f"{'mode':11} {'peak MiB':>9} {'extra MiB':>10} {'extra / largest tensor':>23}")
    for mode, r in results.items():
        extra = r["peak"] - base["peak"]
        print(f"{mode:11} {r['peak'] / mib:9.1f} {extra / mib:10.1f} {extra / base['largest']:23.2f}")


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    main()
