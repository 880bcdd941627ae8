"""Step time and peak memory of private zeroth-order steps on a Llama decoder, against inference and MeZO.

A Llama-shaped decoder with random weights (time and memory do not depend on the weights' values), every
parameter trainable, read by label words (LabelWordClassifier, as bench/memory.py builds it). Each
(shape, case) runs in a fresh process, on the CPU or on a GPU:

    inference   the floor: the two forward passes a two-point step needs, under inference_mode, timed as one
    regenerate  one privzo step: TwoPointEstimator(1, 1e-3), Gaussian directions redrawn from their seed
    cache       the same step with cache_directions=True (the direction kept for the queries and the update)
    mezo        MeZO's step (Malladi et al. 2023, Algorithm 1) written here: in place, z redrawn from torch's
                global seed four times (+lambda, -2 lambda, +lambda, the update); no clipping, no noise
    pazo_m      one PAZO-M step (regenerate mode, sphere directions of radius d^(1/4)) with one public
                forward/backward on a public batch as large as the private one

After ``--warmup`` untimed steps the median of ``--steps`` timed steps is reported (each followed by a device
synchronisation on a GPU), with the peak memory over the timed steps: on a GPU torch's peak device allocation;
on the CPU the process's peak resident set (VmHWM, reset through /proc/self/clear_refs just before the timed
steps, so it includes the interpreter, the libraries and the model: compare it with rss_before_bytes, the
resident set just before the timed steps, for the step's own extra). Prints one JSON line per (shape, case),
then a markdown table (for docs/bench.md) of each case's time over the floor and its peak over inference's.

    PYTHONPATH=. python bench/decoder_step.py --device cpu

Options: --shapes w128-l2 w128-l8 w128-l32 1b 7b, --cases, --batch 4 --length 32, --dtype fp32|bf16
(default fp32 on cpu, bf16 on cuda), --threads 1, --steps 5, --warmup 2, --json PATH (appends the lines).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = ("inference", "regenerate", "cache", "cache_prefetch", "mezo", "pazo_m")
# the small shapes: bench/memory.py's QUICK decoder (hidden 128) at three depths
SMALL_LAYERS = {"w128-l2": 2, "w128-l8": 8, "w128-l32": 32}
TINYLLAMA = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                 num_key_value_heads=4, vocab_size=32000)
SHAPES = tuple(SMALL_LAYERS) + ("1b", "7b")
LABEL_WORDS = [5, 6]
SMOOTHING, LR = 1e-3, 1e-6  # lambda and the learning rate, the same for privzo's steps and MeZO's
MIB = 2 ** 20


def config_for(shape: str):
    """LlamaConfig of a named shape, untied embeddings."""
    from transformers import LlamaConfig

    from bench.memory import LARGE, decoder_config

    if shape in SMALL_LAYERS:
        # bench/memory.py's QUICK decoder, its depth overridden
        return decoder_config(json.dumps({"num_hidden_layers": SMALL_LAYERS[shape], "tie_word_embeddings": False}),
                              quick=True)
    # LARGE is Llama-2-7B's shape; the position tables are the real models' (only --length rows are read)
    fields = {**TINYLLAMA, "max_position_embeddings": 2048} if shape == "1b" \
        else {**LARGE, "max_position_embeddings": 4096}
    return LlamaConfig(**fields, tie_word_embeddings=False)


def peak_reset() -> str:
    """Start a fresh CPU peak: writing 5 to clear_refs sets VmHWM back to the current RSS (Linux). Returns
    which measure the peak will be read from."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return "VmHWM"
    except OSError:
        return "ru_maxrss"  # the process's peak since it started: includes building the model


def proc_status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    return 0


def build(args):
    """The shape's model on the device, its trainable parameters and the rows (private, then public)."""
    import torch
    from transformers import AutoModelForCausalLM

    from components import models
    from components.models.lm import LabelWordClassifier, freeze_lm_

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    config = config_for(args.shapes[0])
    torch.manual_seed(0)
    # built where it runs: a 7B model initialised on the CPU first would take minutes and its memory twice
    with device:
        lm = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    freeze_lm_(lm, "all", "bench")
    model = LabelWordClassifier(lm, True, "lm_head", LABEL_WORDS).to(device)
    params = models.trainable_parameters(model)
    # rows as bench/memory.py's: [n, 3, length] of token ids, attention mask, read position (the last token);
    # pazo_m's public batch (as large as the private one) follows the private rows
    batch, length = args.batch, args.length
    g = torch.Generator().manual_seed(0)
    x = torch.stack([torch.randint(10, config.vocab_size, (2 * batch, length), generator=g),
                     torch.ones(2 * batch, length, dtype=torch.long), torch.zeros(2 * batch, length, dtype=torch.long)], 1)
    x[:, 2, -1] = 1
    y = torch.randint(0, 2, (2 * batch,), generator=g)
    return model, params, x.to(device), y.to(device)


def make_step(case: str, model, params, x, y, batch: int):
    """One step of ``case`` as a function of nothing."""
    import torch

    import bench.step_cost as sc
    from components import models
    from components.accountants import Accountant, PrivacyTracker
    from components.directions import Directions
    from components.estimators import PazoMEstimator, TwoPointEstimator
    from components.estimators.public import PublicOracle
    from components.mechanisms import GaussianMechanism
    from components.optimizers import Sgd
    from components.randomness import private_generator
    from components.runtime import LocalBackend, PrivateLoop

    x_public, y_public, x, y = x[batch:], y[batch:], x[:batch], y[:batch]
    if case == "inference":
        def step():
            with torch.inference_mode():
                models.per_example_loss(model, x, y)
                models.per_example_loss(model, x, y)
        return step
    if case == "mezo":
        seeds = torch.Generator().manual_seed(0)  # the step seeds; the directions use torch's global seed

        def perturb(seed: int, scale: float) -> None:
            torch.manual_seed(seed)
            for p in params:
                z = torch.normal(mean=0, std=1, size=p.shape, device=p.device, dtype=p.dtype)
                p.data.add_(z, alpha=scale)

        def loss() -> float:
            with torch.inference_mode():
                return float(models.per_example_loss(model, x, y).mean())

        def step():
            seed = int(torch.randint(0, 10 ** 9, (1,), generator=seeds))
            perturb(seed, SMOOTHING)
            plus = loss()
            perturb(seed, -2 * SMOOTHING)
            minus = loss()
            perturb(seed, SMOOTHING)  # back to the unperturbed weights
            projected_grad = (plus - minus) / (2 * SMOOTHING)
            perturb(seed, -LR * projected_grad)
        return step
    oracle = None
    if case == "pazo_m":
        # PAZO-M's directions lie on the sphere of radius d^(1/4), as its builder draws them
        d = Directions(params, "sphere", sum(p.numel() for p in params) ** 0.25)
        estimator = PazoMEstimator(1, SMOOTHING, 0.5, batch)
        oracle = PublicOracle(model, params, models.per_example_loss, x_public, y_public, seed=0)
    else:
        d = Directions(params, "gaussian")
        estimator = TwoPointEstimator(1, SMOOTHING)
    backend = LocalBackend(model, d, Sgd(d, lr=LR), x, y, cache_directions=case.startswith("cache"),
                           prefetch_directions=case == "cache_prefetch")
    mech = GaussianMechanism(1.0, 1.0, estimator.queries_per_step, "add_remove", private_generator())
    tracker = PrivacyTracker(Accountant("rdp"), mech.step_event(), 1e-5)
    loop = PrivateLoop(backend, sc.FixedBatch(batch), estimator, mech, tracker, seed=0, public=oracle)

    def step():
        loop.run(loop.step + 1)
    return step


def child_times(args) -> dict:
    """Every case's step on one model, timed in turn within each round (a slow spell of the machine then falls
    on all of them alike): the median of ``--steps`` rounds after ``--warmup``."""
    import torch

    import bench.step_cost as sc

    sc.DEVICE = torch.device(args.device)  # sc.synchronize waits on this device
    model, params, x, y = build(args)
    steps = {case: make_step(case, model, params, x, y, args.batch) for case in args.cases}
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    times = {case: [] for case in steps}
    for _ in range(args.steps):
        for case, step in steps.items():
            sc.synchronize()
            start = time.perf_counter()
            step()
            sc.synchronize()
            times[case].append((time.perf_counter() - start) * 1000)
    return dict(params=sum(p.numel() for p in params), torch=torch.__version__,
                device=torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({torch.get_num_threads()} threads)",
                step_ms={case: statistics.median(t) for case, t in times.items()},
                times_ms={case: [round(v, 3) for v in t] for case, t in times.items()})


def child_peak(args) -> dict:
    """The peak memory of one case, alone in this process, from just after the model is built through
    ``--warmup`` steps and one more: torch's peak allocation on a GPU, the peak resident set on the CPU."""
    import torch

    import bench.step_cost as sc

    sc.DEVICE = device = torch.device(args.device)
    model, params, x, y = build(args)
    step = make_step(args.case, model, params, x, y, args.batch)
    sc.synchronize()
    rss_before = proc_status("VmRSS")
    if device.type == "cuda":
        allocated_before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        peak_kind = "cuda_max_allocated"
    else:
        allocated_before = None
        peak_kind = peak_reset()
    for _ in range(args.warmup + 1):
        step()
    sc.synchronize()
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated()
    elif peak_kind == "VmHWM":
        peak = proc_status("VmHWM")
    else:
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return dict(peak_bytes=peak, peak_kind=peak_kind, rss_before_bytes=rss_before,
                allocated_before_bytes=allocated_before)


def run_child(args, shape: str, kind: str, cases) -> dict:
    """A child process measuring ``kind`` (times: all ``cases`` on one model; peak: the one case): its JSON, or
    ``{"error": ...}`` (the last line of its stderr: out of memory, say)."""
    argv = [sys.executable, __file__, "--child", kind, "--cases", *cases, "--case", cases[0], "--shapes", shape,
            "--device", args.device, "--dtype", args.dtype, "--batch", str(args.batch), "--length", str(args.length),
            "--threads", str(args.threads), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    out = subprocess.run(argv, capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    if out.returncode == 0 and lines:
        try:
            return json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    # a process the kernel killed leaves no stderr
    return {"error": (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]}


def measure_shape(args, shape: str, cases) -> list:
    """One record per case of ``shape``: its median step (all cases timed in one process) and its peak (each
    case in a process of its own)."""
    start = time.perf_counter()
    times = run_child(args, shape, "times", cases)
    records = []
    for case in cases:
        record = dict(shape=shape, case=case, dtype=args.dtype, batch=args.batch, length=args.length,
                      steps=args.steps, warmup=args.warmup, threads=args.threads)
        if "error" in times:
            record["error"] = times["error"]
        else:
            record.update(device=times["device"], params=times["params"], torch=times["torch"],
                          step_ms=times["step_ms"][case], times_ms=times["times_ms"][case])
        if not args.no_peak:
            peak = run_child(args, shape, "peak", [case])
            record.update(peak if "error" not in peak else {"peak_error": peak["error"]})
        records.append(record)
    for record in records:
        record["wall_s"] = round(time.perf_counter() - start, 1)
    return records


def table(records: list, cases: list) -> list:
    """Markdown rows, one per shape: each case's ms (× the floor's) and its peak MiB (× inference's)."""
    def value(r, key, scale=1):
        return None if r is None or "error" in r or key not in r else r[key] / scale

    def cell(x, base, ratio=True):
        if x is None:
            return "failed"
        return f"{x:.1f}" if not ratio or base is None else f"{x:.1f} (×{x / base:.2f})"

    versus_mezo = "regenerate" in cases and "mezo" in cases
    header = (["shape", "params"] + [f"{c} ms" for c in cases] + (["regenerate / MeZO"] if versus_mezo else [])
              + [f"{c} peak MiB" for c in cases])
    rows = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for shape in dict.fromkeys(r["shape"] for r in records):
        by_case = {r["case"]: r for r in records if r["shape"] == shape}
        ok = [r for r in by_case.values() if "error" not in r]
        ms = {c: value(by_case.get(c), "step_ms") for c in cases}
        mib = {c: value(by_case.get(c), "peak_bytes", MIB) for c in cases}
        cells = [shape, f"{ok[0]['params']:,}" if ok else "-"]
        cells += [cell(ms[c], ms.get("inference"), c != "inference") for c in cases]
        if versus_mezo:
            regen, mezo = ms["regenerate"], ms["mezo"]
            cells.append(f"{regen / mezo:.2f}" if regen is not None and mezo is not None else "-")
        for c in cases:
            r = by_case.get(c)
            extra = None if r is None or "peak_bytes" not in r else (r["peak_bytes"] - r["rss_before_bytes"]) / MIB
            measured = r is not None and ("peak_bytes" in r or "peak_error" in r or "error" in r)
            text = cell(mib[c], mib.get("inference"), c != "inference") if measured else "-"  # --no-peak
            # the step's own: the peak over the process just before its first step (model, rows, libraries)
            cells.append(text if extra is None else f"{text} +{extra:.1f}")
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shapes", nargs="+", default=list(SMALL_LAYERS), choices=SHAPES)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--dtype", default=None, choices=["fp32", "bf16"], help="default fp32 on cpu, bf16 on cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each measuring process")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (median reported)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--json", default=None, help="also append the JSON lines to this file")
    parser.add_argument("--no-peak", action="store_true", help="times only (no process per case for its peak)")
    parser.add_argument("--child", choices=["times", "peak"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    if args.child:
        print(json.dumps(child_times(args) if args.child == "times" else child_peak(args)), flush=True)
        return

    cases = [c for c in CASES if c in args.cases]  # the table's order, whatever the command line's
    records = []
    for shape in args.shapes:
        for r in measure_shape(args, shape, cases):
            records.append(r)
            line = json.dumps(r)
            print(line, flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(line + "\n")
    ok = [r for r in records if "error" not in r]
    first = ok[0] if ok else {"device": args.device, "torch": "-"}
    peak_kind = next((r["peak_kind"] for r in records if "peak_kind" in r), "-")
    print()
    print(f"Llama decoder (random weights, label words), {first['device']}, {args.dtype}, batch {args.batch} × "
          f"{args.length} tokens, median of {args.steps} rounds after {args.warmup} (every case once a round, "
          f"in one process), peak: {peak_kind} (each case alone), torch {first['torch']}; ms (×inference ms), "
          "MiB (×inference peak)")
    print()
    print("\n".join(table(records, cases)))
    for r in records:
        for key in ("error", "peak_error"):
            if key in r:
                print(f"\n{r['shape']} {r['case']} {key.replace('_', ' ')}: {r[key]}")


if __name__ == "__main__":
    # run as a script (and in each child): the repository root, for bench.* and components.*
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
