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

``--model decoder`` measures the memory planner (components/memory_plan.py) instead: a Llama decoder built from its
config with random weights (memory does not depend on the weights' values), read by label words, in fp32 and
bf16; inference, DPZero in regenerate and cache mode, and DP-SGD, each in a fresh process. The measure is the
peak of torch's own CPU allocations (torch.profiler with profile_memory: every allocation and free with the
running total), from just before the first step to the end: bytes, not pages, so neither the interpreter and
its libraries (a few hundred MiB of RSS) nor the allocator's caching blur a difference the size of one module.
tracemalloc sees none of it (torch allocates outside Python's allocator), and ru_maxrss counts what was
imported, the malloc arenas' retained pages and here the profiler's own event buffers (hundreds of MiB for
regenerate mode's per-chunk ops): not printed. Each measurement is printed next to the planner's estimate of
the same step (weights, the step, the rows; no checkpoint or optimizer state) and their ratio.

    python bench/memory.py --model decoder [--quick] [--config JSON|config.json] [--precisions fp32 bf16]
                           [--task label_words|completion] [--batch 8] [--length 64]
"""
from __future__ import annotations

import argparse
import json
import os
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
    """Bytes a backprop step holds above inference, from how components/queries/clipped_sums.py forms
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
    from components.directions import Directions
    from components.estimators import FirstOrderEstimator, GepEstimator, PazoMEstimator, TwoPointEstimator
    from components.queries.clipped_sums import PER_EXAMPLE_GRADIENT_BYTES
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


# a Llama decoder whose weights dominate the process: 8 layers of hidden 768, a 32,000-token vocabulary
DECODER = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=12,
               num_key_value_heads=12, vocab_size=32000, max_position_embeddings=512)
QUICK = dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, vocab_size=4000, max_position_embeddings=128)
DECODER_CASES = ("inference", "regenerate", "cache", "dp_sgd", "pazo_m", "pazo_p", "pazo_s", "dope_sgd")
DEFAULT_CASES = DECODER_CASES[:4]  # the public-data estimators with --cases
PLANNED_AS = {"inference": "inference", "regenerate": "two_point", "cache": "two_point", "dp_sgd": "first_order",
              "pazo_m": "pazo_m", "pazo_p": "pazo_p", "pazo_s": "pazo_s", "dope_sgd": "dope_sgd"}
# public gradients a step forms, each from a public batch as large as the private one (PAZO-P's and PAZO-S's k)
PUBLIC_BATCHES = {"pazo_m": 1, "pazo_p": 3, "pazo_s": 3, "dope_sgd": 1}
MARKER = 7_777_777  # bytes of a tensor allocated and freed where the measured window starts: found in the trace


def decoder_config(text: str, quick: bool):
    """A JSON object of LlamaConfig fields over the bench's decoder, or a path to a config.json (a folder or
    the file) of any causal architecture privzo reads."""
    from transformers import AutoConfig, LlamaConfig

    path = Path(text) if text else None
    if path is not None and path.exists():
        return AutoConfig.from_pretrained(str(path.parent if path.is_file() else path))
    return LlamaConfig(**{**(QUICK if quick else DECODER), **(json.loads(text) if text else {})})


def planned_decoder(case: str, config, precision: str, batch: int, length: int, task: str = "label_words"):
    """The planner's estimate of the step ``case`` runs: weights, the step's extra and the rows (no checkpoint,
    no optimizer state: the bench keeps neither)."""
    import torch
    from transformers import AutoModelForCausalLM

    from components import memory_plan
    from components.models.lm import freeze_lm_

    element = memory_plan.PRECISION_BYTES[precision]
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    freeze_lm_(lm, "all", "bench")
    sizes = memory_plan.module_sizes(lm, element, lm_config=config)
    rows = batch * 3 * length * 8 + batch * 8  # int64 [b, 3, L] and the labels
    k = PUBLIC_BATCHES.get(case, 0)
    rows += k * (batch * 3 * length * 8 + batch * 8)  # the public rows, on the device too
    settings = memory_plan.Settings(PLANNED_AS[case], batch, length, cache=case == "cache", rows_bytes=rows,
                               checkpoint=False, completion=task == "completion", public_batch=batch if k else 0,
                               public_gradients=k)
    return memory_plan.estimate(sizes, settings).step + rows


def measure_decoder(case: str, config, precision: str, batch: int, length: int, task: str = "label_words") -> dict:
    """Peak bytes of torch's CPU allocations over two steps of ``case`` (one for DP-SGD), model included."""
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    import bench.step_cost as sc
    from components import models
    from components.accountants import Accountant, PrivacyTracker
    from components.directions import Directions
    from components.estimators import (DopeSgdEstimator, FirstOrderEstimator, PazoMEstimator, PazoPEstimator,
                                       PazoSEstimator, TwoPointEstimator)
    from components.estimators.public import PublicOracle
    from components.mechanisms import GaussianMechanism
    from components.models.lm import CompletionScorer, LabelWordClassifier, freeze_lm_
    from components.optimizers import Sgd
    from components.randomness import private_generator
    from components.runtime import LocalBackend, PrivateLoop

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            lm = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
        freeze_lm_(lm, "all", "bench")
        model = (CompletionScorer(lm, True, "lm_head") if task == "completion"
                 else LabelWordClassifier(lm, True, "lm_head", [5, 6]))
        g = torch.Generator().manual_seed(0)
        k = PUBLIC_BATCHES.get(case, 0)
        n = batch * (1 + k)  # the private batch, then k public batches of its size
        x = torch.stack([torch.randint(10, config.vocab_size, (n, length), generator=g),
                         torch.ones(n, length, dtype=torch.long), torch.zeros(n, length, dtype=torch.long)], 1)
        # label words: each row reads its last position; a completion: its last quarter is scored (never the
        # last position, which predicts nothing)
        x[:, 2, -1 if task == "label_words" else slice(-length // 4 - 1, -1)] = 1
        y = torch.randint(0, 2, (n,), generator=g)
        x_public, y_public, x, y = x[batch:], y[batch:], x[:batch], y[:batch]
        params = models.trainable_parameters(model)
        marker = torch.empty(MARKER, dtype=torch.uint8)  # the window starts at its allocation
        del marker
        if case == "inference":
            for _ in range(2):
                with torch.inference_mode():
                    models.per_example_loss(model, x, y)
        else:
            d = Directions(params, "gaussian")
            estimator = {"dp_sgd": lambda: FirstOrderEstimator(), "pazo_m": lambda: PazoMEstimator(1, 1e-3, 0.5, batch),
                         "pazo_p": lambda: PazoPEstimator(1, 1e-3, k, batch, "orthonormal"),
                         "pazo_s": lambda: PazoSEstimator(k, batch, 1e-3, 1e-6),
                         "dope_sgd": lambda: DopeSgdEstimator(batch)}.get(case, lambda: TwoPointEstimator(1, 1e-3))()
            backend = LocalBackend(model, d, Sgd(d, lr=1e-6), x, y, cache_directions=case == "cache")
            oracle = PublicOracle(model, params, models.per_example_loss, x_public, y_public, seed=0) if k else None
            mech = GaussianMechanism(1.0, 1.0, estimator.queries_per_step, "add_remove", private_generator())
            loop = PrivateLoop(backend, sc.FixedBatch(batch), estimator, mech,
                               PrivacyTracker(Accountant("rdp"), mech.step_event(), 1e-5), seed=0, public=oracle)
            loop.run(1 if case in ("dp_sgd", "dope_sgd") else 2)
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        with open(f"{tmp}/trace.json") as f:
            trace = [e for e in json.load(f)["traceEvents"] if e.get("name") == "[memory]"]
    events = [e["args"] for e in sorted(trace, key=lambda e: e["ts"])]  # a stable sort: ties keep their order
    freed = next(i for i, a in enumerate(events) if a["Bytes"] == -MARKER)  # the window: after the marker
    peak = max(a["Total Allocated"] for a in events[freed:])
    return {"peak": peak, "params": sum(p.numel() for p in params)}


def decoder_main(args) -> None:
    config = decoder_config(args.config, args.quick)
    batch, length = args.batch or (4 if args.quick else 8), args.length or (32 if args.quick else 64)
    if args.child:
        print(json.dumps(measure_decoder(args.child, config, args.precision, batch, length, args.task)))
        return
    results = []
    for precision in args.precisions:
        for case in args.cases:
            out = subprocess.run([sys.executable, __file__, "--model", "decoder", "--child", case, "--precision",
                                  precision, "--config", args.config, "--batch", str(batch), "--length", str(length),
                                  "--task", args.task]
                                 + (["--quick"] if args.quick else []), capture_output=True, text=True)
            if out.returncode != 0:
                last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
                sys.exit(f"bench/memory.py: decoder {case} {precision} failed: {last}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r.update(case=case, precision=precision,
                     planned=planned_decoder(case, config, precision, batch, length, args.task))
            results.append(r)
    print(f"# peak of torch's CPU allocations (torch.profiler, profile_memory), {os.cpu_count()} CPU cores; "
          f"{config.model_type} decoder: hidden {config.hidden_size}, {config.num_hidden_layers} layers, MLP "
          f"{config.intermediate_size}, vocabulary {config.vocab_size}, {results[0]['params']:,} parameters, all "
          f"trainable; batch {batch} x {length} tokens, {args.task.replace('_', ' ')}")
    print(f"{'case':11} {'precision':9} {'measured MiB':>12} {'planned MiB':>11} {'planned/meas.':>13} "
          f"{'/ inference':>11}")
    base = {r["precision"]: r["peak"] for r in results if r["case"] == "inference"}
    for r in results:
        versus = f"{r['peak'] / base[r['precision']]:11.3f}" if r["precision"] in base else f"{'-':>11}"
        print(f"{r['case']:11} {r['precision']:9} {r['peak'] / MIB:12.1f} {r['planned'] / MIB:11.1f} "
              f"{r['planned'] / r['peak']:13.3f} {versus}")
    if not args.quick:
        print("\n".join(planned_large()))


# Llama-2-7B's shape, planned from its config alone: what the planner says where no CPU run could measure it
LARGE = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=32, vocab_size=32000)


def planned_large(batch: int = 16, length: int = 128) -> list:
    from transformers import LlamaConfig

    config = LlamaConfig(**LARGE)
    cells = [(precision, case, planned_decoder(case, config, precision, batch, length))
             for precision in ("fp32", "bf16") for case in DECODER_CASES]
    base = {precision: bytes_ for precision, case, bytes_ in cells if case == "inference"}
    return [f"# planned only, Llama-2-7B's shape (no weights), batch {batch} x {length}: "
            + "; ".join(f"{precision} {case} {bytes_ / 2**30:.1f} GiB ({bytes_ / base[precision]:.2f}x)"
                        for precision, case, bytes_ in cells)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="transformer", choices=["transformer", "mlp", "decoder"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS,
                        help="inference, the baseline, always runs")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="decoder: a hidden-128, 2-layer decoder, batch 4 x 32")
    parser.add_argument("--config", default="", help="decoder: a JSON object of LlamaConfig fields, or a "
                        "config.json path")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), choices=DECODER_CASES)
    parser.add_argument("--task", default="label_words", choices=["label_words", "completion"],
                        help="decoder: classification by label words, or a completion's loss (logits at every token)")
    parser.add_argument("--length", type=int, default=0, help="decoder: tokens per row (default 64; --quick 32)")
    parser.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.model == "decoder":
        decoder_main(args)
        return
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
