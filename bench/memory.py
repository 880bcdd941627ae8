"""Peak memory of private training steps against inference: DPZero, PAZO-M, DP-SGD and GEP (DPZero's Table 3).

Each method runs in a fresh process, which reports its peak memory (on CPU the resident set, ru_maxrss;
on a GPU the peak of torch's device allocations, which is what a GPU runs out of), on the transformer
(MiniLM + linear head, every parameter trainable) or the MLP of bench/step_cost.py, at its private batch:

    inference     forward passes only
    dpzero        two_point steps (DPZero) in regenerate mode: the direction is redrawn from its seed
    dpzero_cache  two_point steps in cache mode: the direction is kept, with a perturbed parameter copy
    pazo_m        PAZO-M steps (regenerate mode), with one public backward pass on as many public rows
    dp_sgd        first_order steps (DP-SGD): per-example gradients, formed a chunk of rows at a time
    gep           GEP steps: per-example gradients of as many public rows (16 anchors) and of the private rows

Extra memory (peak - inference's peak) is printed in MiB, in units of the largest parameter tensor and
of all parameters, and against DP-SGD's extra. The backprop methods hold per-example gradients (a
d-sized vector per row), so their extra is estimated first: a batch whose estimate does not fit in half
of the memory available when the bench starts is halved until it does, and the batch is printed. On CPU
each process's data is also capped at that budget, so that an estimate that was too low ends in an
allocation error (the batch is then halved again) instead of the machine running out of memory.

    python bench/memory.py [--model transformer|mlp] [--device cpu|cuda] [--methods dpzero dp_sgd ...]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

ZEROTH = ("dpzero", "dpzero_cache", "pazo_m")
BACKPROP = ("dp_sgd", "gep")
METHODS = ("inference",) + ZEROTH + BACKPROP
ANCHORS = 16
ZEROTH_STEPS = 4
BACKPROP_STEPS = 2  # a GEP step on MiniLM takes about 35 s on 2 cores; the second shows nothing is kept
MIB = 2 ** 20


def public_rows(method: str, batch: int) -> int:
    """Public rows a step uses: as many as private ones (PAZO-M's gradient batch, GEP's anchor batch)."""
    return batch if method in ("pazo_m", "gep") else 0


def estimated_extra(method: str, param_bytes: int, batch: int, chunk_bytes: int) -> int:
    """Bytes a backprop step holds above inference, from how components/estimators/evaluate.py forms
    per-example gradients (chunks of about ``chunk_bytes``; GEP's private split in chunks of a third).
    Zeroth-order steps hold a few d-sized vectors at most: 0 here, they need no guard."""
    if method not in BACKPROP:
        return 0
    d = param_bytes

    def chunk_rows(share: int) -> int:
        return min(batch, max(1, chunk_bytes // (d * share)))

    if method == "dp_sgd":
        # a chunk of per-example gradients and vmap's own copy of it; float64 sums, the noise, the update
        return 2 * chunk_rows(1) * d + 8 * d
    anchors = min(ANCHORS, batch)
    # the [rows, d] anchor matrix, a chunk of per-example gradients written into it, then the [k, d] basis
    anchor_phase = batch * d + max(2 * chunk_rows(1) * d, anchors * d)
    # the basis, the float64 residual sum, and a chunk's per-tensor gradients, their join g, the product w B
    # and the residuals
    split_phase = anchors * d + 2 * d + 4 * chunk_rows(3) * d
    update_phase = anchors * d + 6 * d  # the basis, B^T w~ in float64 and a row's float64 copy, the update
    return max(anchor_phase, split_phase, update_phase)


def batch_that_fits(method: str, param_bytes: int, batch: int, chunk_bytes: int, base: int, budget: int) -> int:
    """The largest of batch, batch/2, batch/4, ... whose estimated peak (``base`` + extra) is within ``budget``."""
    while batch > 1 and base + estimated_extra(method, param_bytes, batch, chunk_bytes) > budget:
        batch //= 2
    return batch


def available_bytes(device: str) -> int:
    if device == "cuda":
        import torch
        return torch.cuda.mem_get_info()[0]
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    return int(fields["MemAvailable"].split()[0]) * 1024  # reported in kB


def measure(method: str, model_name: str, device: str, batch: int) -> dict:
    import torch

    import bench.step_cost as sc
    sc.DEVICE = torch.device(device)
    from components import models
    from components.accountants import Accountant, PrivacyTracker
    from components.estimators import (Directions, FirstOrderEstimator, GepEstimator, PazoMEstimator,
                                       TwoPointEstimator)
    from components.estimators.evaluate import PER_EXAMPLE_GRADIENT_BYTES
    from components.estimators.public import PublicOracle
    from components.mechanisms import GaussianMechanism
    from components.optimizers import Sgd
    from components.randomness import private_generator
    from components.runtime import LocalBackend, PrivateLoop

    batch = batch or sc.BATCHES[model_name]
    model = sc.build_model(model_name).eval()
    public = public_rows(method, batch)
    x, y = sc.data_for(model_name, batch + public)  # private rows first (the fixed batch), then public ones
    params = models.trainable_parameters(model)
    largest = max(p.numel() * p.element_size() for p in params)
    total = sum(p.numel() * p.element_size() for p in params)
    if method == "inference":
        for _ in range(ZEROTH_STEPS):
            with torch.inference_mode():
                models.per_example_loss(model, x, y)
    else:
        estimator = {
            "dpzero": lambda: TwoPointEstimator(1, 1e-3),
            "dpzero_cache": lambda: TwoPointEstimator(1, 1e-3),
            "pazo_m": lambda: PazoMEstimator(1, 1e-3, mix=0.5, public_batch_size=public),
            "dp_sgd": lambda: FirstOrderEstimator(),
            "gep": lambda: GepEstimator(anchors=min(ANCHORS, public), public_batch_size=public, residual_clip=1.0,
                                        embedding_share=0.5),
        }[method]()
        # PAZO-M's directions lie on the sphere of radius d^(1/4), as its builder draws them
        d = Directions(params, "sphere", sum(p.numel() for p in params) ** 0.25) if method == "pazo_m" \
            else Directions(params, "gaussian")
        backend = LocalBackend(model, d, Sgd(d, lr=1e-6), x[:batch], y[:batch],
                               cache_directions=(method == "dpzero_cache"))
        oracle = PublicOracle(model, params, models.per_example_loss, x[batch:], y[batch:], seed=0) if public else None
        mech = GaussianMechanism(1.0, 1.0, estimator.queries_per_step, "add_remove", private_generator())
        loop = PrivateLoop(backend, sc.FixedBatch(batch), estimator, mech,
                           PrivacyTracker(Accountant("rdp"), mech.step_event(), 1e-5), seed=0, public=oracle)
        loop.run(BACKPROP_STEPS if method in BACKPROP else ZEROTH_STEPS)
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {"peak": peak, "largest": largest, "params": total, "batch": batch, "public": public,
            "chunk": PER_EXAMPLE_GRADIENT_BYTES}


def run_child(method: str, model: str, device: str, batch: int, limit: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, __file__, "--model", model, "--device", device, "--child", method,
                           "--batch", str(batch), "--limit", str(limit)], capture_output=True, text=True)


def out_of_memory(stderr: str) -> bool:
    return any(s in stderr for s in ("can't allocate memory", "out of memory", "MemoryError"))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="transformer", choices=["transformer", "mlp"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS,
                        help="inference, the baseline, always runs")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.limit and args.device == "cpu":
            # anonymous memory past the budget fails to allocate instead of pushing the machine out of memory
            # (not on a GPU: the CUDA context maps far more address space than it uses)
            resource.setrlimit(resource.RLIMIT_DATA, (args.limit, args.limit))
        print(json.dumps(measure(args.child, args.model, args.device, args.batch)))
        return

    budget = available_bytes(args.device) // 2
    methods = ["inference"] + [m for m in METHODS[1:] if m in args.methods]
    results, notes = {}, []
    for method in methods:
        batch = full = results["inference"]["batch"] if results else 0  # 0: the model's own (step_cost's BATCHES)
        if method in BACKPROP:
            base = results["inference"]
            batch = batch_that_fits(method, base["params"], full, base["chunk"], base["peak"], budget)
            if batch < full:
                need = base["peak"] + estimated_extra(method, base["params"], full, base["chunk"])
                notes.append(f"{method}: estimated peak {need / 2**30:.1f} GiB at batch {full} is over the budget "
                             f"{budget / 2**30:.1f} GiB (half the memory available): measured at batch {batch}")
        while True:
            out = run_child(method, args.model, args.device, batch, budget)
            if out.returncode == 0:
                break
            if out_of_memory(out.stderr) and batch > 1:
                notes.append(f"{method}: out of memory at batch {batch} (budget {budget / 2**30:.1f} GiB): "
                             f"measured at batch {batch // 2}")
                batch //= 2
                continue
            last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
            sys.exit(f"bench/memory.py: {method} failed at batch {batch}: {last}")
        results[method] = json.loads(out.stdout.strip().splitlines()[-1])

    base = results["inference"]
    sgd = results.get("dp_sgd")
    sgd_extra = sgd["peak"] - base["peak"] if sgd else None
    what = "peak GPU allocation" if args.device == "cuda" else "peak RSS"
    print(f"# {what}, {args.model}: parameters {base['params'] / MIB:.1f} MiB, largest tensor "
          f"{base['largest'] / MIB:.1f} MiB; memory budget {budget / 2**30:.1f} GiB")
    for note in notes:
        print(f"# {note}")
    print(f"{'method':13} {'batch':>5} {'public':>6} {'peak MiB':>9} {'extra MiB':>10} {'/ largest':>10} "
          f"{'/ params':>9} {'/ dp_sgd':>9} {'estimated':>10}")
    for method, r in results.items():
        extra = r["peak"] - base["peak"]
        versus = f"{extra / sgd_extra:9.3f}" if sgd_extra and sgd_extra > 0 else f"{'-':>9}"
        # the guard's estimate beside the measurement, for the methods it guards
        guess = f"{estimated_extra(method, base['params'], r['batch'], base['chunk']) / MIB:10.1f}" \
            if method in BACKPROP else f"{'-':>10}"
        print(f"{method:13} {r['batch']:5d} {r['public']:6d} {r['peak'] / MIB:9.1f} {extra / MIB:10.1f} "
              f"{extra / base['largest']:10.2f} {extra / base['params']:9.2f} {versus} {guess}")
    if "dpzero" in results and sgd_extra and sgd_extra > 0:
        dpzero_extra = results["dpzero"]["peak"] - base["peak"]
        same = "" if sgd["batch"] == results["dpzero"]["batch"] else f" (DP-SGD at batch {sgd['batch']})"
        print(f"# DPZero's extra over inference is {dpzero_extra / sgd_extra:.3f} of DP-SGD's{same}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
